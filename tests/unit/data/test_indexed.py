"""The writer produces Megatron's bytes: checked with megatron-core's own reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmctl.data import indexed


def _docs(seed: int, n: int, vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=rng.integers(1, 50)) for _ in range(n)]


def _write(prefix: Path, docs: list[np.ndarray], dtype: type) -> None:
    w = indexed.ShardWriter(prefix, dtype)
    for i in range(0, len(docs), 7):
        part = docs[i : i + 7]
        w.add_documents(np.concatenate(part), np.array([len(d) for d in part]))
    w.close()


@pytest.mark.parametrize(("vocab", "dtype"), [(65499, np.uint16), (65500, np.int32)])
def test_dtype_follows_megatron(vocab: int, dtype: type) -> None:
    from megatron.core.datasets.indexed_dataset import DType

    assert indexed.token_dtype(vocab) is dtype
    assert DType.optimal_dtype(vocab) is dtype


@pytest.mark.parametrize("vocab", [1000, 100_000])
def test_megatron_reads_merged_shards(tmp_path: Path, vocab: int) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dtype = indexed.token_dtype(vocab)
    docs = _docs(0, 40, vocab)
    shards = [tmp_path / f"s{i}" for i in range(3)]
    for s, part in zip(shards, (docs[:5], docs[5:5], docs[5:]), strict=True):
        _write(s, part, dtype)
    indexed.merge_shards(shards, tmp_path / "merged", dtype)
    _write(tmp_path / "single", docs, dtype)
    ds = IndexedDataset(str(tmp_path / "merged"))
    assert len(ds) == len(docs)
    assert ds.index.dtype == dtype
    assert all(np.array_equal(ds[i], d) for i, d in enumerate(docs))
    assert list(ds.document_indices) == list(range(len(docs) + 1))
    for suffix in (".bin", ".idx"):
        merged = (tmp_path / f"merged{suffix}").read_bytes()
        assert merged == (tmp_path / f"single{suffix}").read_bytes()


def test_megatron_builder_bytes_equal(tmp_path: Path) -> None:
    """Same documents through megatron-core's IndexedDatasetBuilder give identical files."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    docs = _docs(1, 30, 5000)
    builder = IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(d, [len(d)])
    builder.finalize(str(tmp_path / "mc.idx"))
    _write(tmp_path / "ours", docs, np.uint16)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (tmp_path / f"mc{suffix}").read_bytes()


def test_read_header_rejects_garbage(tmp_path: Path) -> None:
    (tmp_path / "bad.idx").write_bytes(b"not an index at all, clearly")
    with pytest.raises(ValueError, match="bad magic"):
        indexed.read_header(tmp_path / "bad")


def test_empty_documents_match_megatron_builder_across_shards(tmp_path: Path) -> None:
    """A document without tokens is a document-index entry and no sequence, as megatron-core's
    builder records `add_document([], [])` (what Megatron-LM's preprocess_data.py does for an
    empty text); merged shards give the same bytes as one builder pass."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    docs = _docs(2, 12, 5000)
    for i in (0, 3, 4, 11):
        docs[i] = np.zeros(0, np.int64)
    builder = IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(d, [len(d)] if len(d) else [])
    builder.finalize(str(tmp_path / "mc.idx"))
    shards = [tmp_path / f"s{i}" for i in range(3)]
    for s, part in zip(shards, (docs[:4], docs[4:5], docs[5:]), strict=True):
        _write(s, part, np.uint16)
    indexed.merge_shards(shards, tmp_path / "merged", np.uint16)
    _write(tmp_path / "single", docs, np.uint16)
    for name in ("merged", "single"):
        for suffix in (".bin", ".idx"):
            ours = (tmp_path / f"{name}{suffix}").read_bytes()
            assert ours == (tmp_path / f"mc{suffix}").read_bytes(), (name, suffix)
    ds = IndexedDataset(str(tmp_path / "merged"))
    assert len(ds) == 8 and len(ds.document_indices) == 13
    assert list(ds.document_indices[:6]) == [0, 0, 1, 2, 2, 2]
