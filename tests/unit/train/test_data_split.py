"""The data pre-checks that stop megatron-core's GPTDataset from hanging or reusing stale
indices: an empty split is refused, and the index-cache key follows the data's content."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmctl.errors import UserError
from llmctl.run.data import check_split, data_fingerprint, num_documents


def _write(prefix: Path, docs: list[list[int]]) -> str:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for doc in docs:
        builder.add_document(np.array(doc, dtype=np.uint16), [len(doc)])
    builder.finalize(str(prefix) + ".idx")
    return str(prefix)


def test_document_count_and_empty_split(tmp_path: Path) -> None:
    prefix = _write(tmp_path / "few", [[1, 2, 3]] * 10)
    assert num_documents(prefix) == 10
    with pytest.raises(UserError, match=r"validation split of data\.split=98,2,0 empty"):
        check_split(prefix, "98,2,0")
    check_split(prefix, "80,20,0")
    with pytest.raises(UserError, match="expected numbers"):
        check_split(prefix, "a,b")


def test_fingerprint_follows_content(tmp_path: Path) -> None:
    prefix = _write(tmp_path / "d", [[1, 2, 3]] * 4)
    first = data_fingerprint((prefix,))
    _write(tmp_path / "d", [[1, 2, 3, 4]] * 4)
    assert data_fingerprint((prefix,)) != first
