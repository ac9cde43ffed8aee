"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def toy_prefix(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small Megatron indexed dataset (.bin/.idx): runs of consecutive token ids."""
    import numpy as np

    from llmctl.data.indexed import ShardWriter

    prefix = tmp_path_factory.mktemp("data") / "toy"
    rng = np.random.default_rng(0)
    starts, lengths = rng.integers(0, 4000, 300), rng.integers(50, 200, 300)
    docs = [np.arange(s, s + n) % 4096 for s, n in zip(starts, lengths, strict=True)]
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(np.concatenate(docs), np.array([len(d) for d in docs]))
    writer.close()
    return str(prefix)
