"""Fixtures for the training tests: the real demo corpus, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory holding the demo corpus (stdlib sources -> BPE -> .bin/.idx)."""
    from llmctl.data.demo import prepare_demo_data

    cache = tmp_path_factory.mktemp("demo-cache")
    prepare_demo_data(cache)
    return cache


@pytest.fixture
def one_thread():
    """One intra-op thread while training in-process.

    Measured on the shared 2-core CI machine with other jobs running (load 12-17): torch's
    default two OpenMP threads spin against each other and made a 50-step run take 93 s instead
    of 12 s. One thread per process is also what torchrun sets for multi-rank runs.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
