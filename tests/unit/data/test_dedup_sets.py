"""dedup's batched exact Jaccard (llmctl.data.shinglesets) equals Python set arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

import llmctl.data.shinglesets as shinglesets
from llmctl.data.shinglesets import ShingleSets, sorted_unique


@pytest.mark.parametrize("block", [1 << 22, 7])  # one block, and pairs cut into many blocks
def test_pair_jaccard_equals_python_sets(monkeypatch, block: int) -> None:
    monkeypatch.setattr(shinglesets, "_PAIR_BLOCK", block)
    rng = np.random.default_rng(0)
    docs = np.sort(rng.choice(10_000, size=60, replace=False))
    # small alphabets so that sets overlap; repeats inside a document; two empty documents
    sets = [rng.integers(0, int(rng.integers(1, 40)), size=int(rng.integers(0, 30))) for _ in docs]
    sets[3] = sets[7] = np.zeros(0, np.int64)
    hashes = np.concatenate(sets).astype(np.uint32) * np.uint32(0x9E3779B1)  # use all 32 bits
    table = ShingleSets.build(docs, hashes, np.array([len(s) for s in sets]))
    py = {int(d): {int(v) for v in s.astype(np.uint32) * np.uint32(0x9E3779B1)}
          for d, s in zip(docs, sets, strict=True)}  # fmt: skip
    a, b = rng.choice(docs, size=500), rng.choice(docs, size=500)
    a[:2], b[:2] = docs[3], [docs[7], docs[5]]  # empty-empty, empty-nonempty
    want = [
        len(py[x] & py[y]) / len(py[x] | py[y]) if py[x] | py[y] else 1.0
        for x, y in zip(a.tolist(), b.tolist(), strict=True)
    ]
    assert table.jaccard(a, b).tolist() == pytest.approx(want, abs=1e-12)
    assert all(sorted(py[int(d)]) == table.get(int(d)).tolist() for d in docs)
    assert table.covers(docs[::2]) and not table.covers(np.array([10_001]))
    with pytest.raises(KeyError):
        table.jaccard(np.array([docs[0]]), np.array([10_001]))


def test_sorted_unique_and_stored_runs() -> None:
    x = np.array([5, 1, 5, 3, 1, 1], dtype=np.uint64)
    assert sorted_unique(x).tolist() == [1, 3, 5] and sorted_unique(x[:1]).tolist() == [5]
    store = np.array([9, 9, 2, 4, 4, 1, 7], dtype=np.uint32)  # doc d: store[off[d]:off[d+1]]
    off = np.array([0, 2, 5, 5, 7])
    table = ShingleSets.from_runs(np.array([0, 1, 2, 3]), store, off)
    assert [table.get(d).tolist() for d in range(4)] == [[9], [2, 4], [], [1, 7]]
