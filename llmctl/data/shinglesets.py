"""The distinct shingle hashes of many documents in one sorted array, and the exact Jaccard
similarity of many document pairs at once (dedup's verification and precision estimate).

Why this shape: per-document `np.unique` and per-pair `np.intersect1d` cost ~40 us of numpy
call overhead each (and numpy 2's `np.unique` hashes, which is slower than sorting here). Here
each set is one run of a sorted uint64 array keyed (document rank << 32 | hash), built with one
SIMD `np.sort`; a block of pairs is compared by sorting (pair << 32 | hash) for both members
and counting equal neighbours.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

_PAIR_BLOCK = 1 << 22
"""Shingles sorted at once when comparing pairs (32 MiB of keys)."""
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """The distinct values of a 1-D array, ascending (`np.sort` and a neighbour test)."""
    s = np.sort(x)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    out: np.ndarray = s[keep]
    return out


def segments(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices starts[i] .. starts[i] + lengths[i] - 1 for every i, concatenated."""
    total = int(lengths.sum())
    shift = starts - (np.cumsum(lengths) - lengths)
    out: np.ndarray = np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)
    return out


@dataclass(frozen=True, slots=True)
class ShingleSets:
    """Distinct uint32 shingle hashes per document: docs[i]'s at values[offsets[i]:offsets[i+1]]."""

    docs: np.ndarray
    """Sorted distinct document ids (int64)."""
    values: np.ndarray
    """uint32 hashes, ascending within each document."""
    offsets: np.ndarray
    """(len(docs) + 1,) int64."""

    @classmethod
    def build(cls, docs: np.ndarray, hashes: np.ndarray, lengths: np.ndarray) -> ShingleSets:
        """From sorted distinct `docs` and their shingle hashes, concatenated (`lengths[i]` of
        them for docs[i], in any order, with repeats)."""
        docs = np.asarray(docs, dtype=np.int64)
        if not len(hashes):
            return cls(docs, np.zeros(0, np.uint32), np.zeros(len(docs) + 1, np.int64))
        rank = np.repeat(np.arange(len(docs), dtype=np.uint64), lengths)
        keys = sorted_unique((rank << _SHIFT) | hashes.astype(np.uint64))
        offsets = np.searchsorted(keys >> _SHIFT, np.arange(len(docs) + 1, dtype=np.uint64))
        return cls(docs, (keys & _LOW).astype(np.uint32), offsets.astype(np.int64))

    @classmethod
    def from_runs(cls, docs: np.ndarray, hashes: np.ndarray, offsets: np.ndarray) -> ShingleSets:
        """From sorted distinct `docs` of a store where doc d's hashes are
        hashes[offsets[d]:offsets[d + 1]] (a memory map is read only there)."""
        lengths = offsets[docs + 1] - offsets[docs]
        return cls.build(docs, np.asarray(hashes)[segments(offsets[docs], lengths)], lengths)

    def covers(self, wanted: np.ndarray) -> bool:
        """Whether every id in `wanted` has its set here."""
        if not len(wanted):
            return True
        pos = np.minimum(np.searchsorted(self.docs, wanted), max(len(self.docs) - 1, 0))
        return bool(len(self.docs)) and bool(np.all(self.docs[pos] == wanted))

    def get(self, doc: int) -> np.ndarray:
        """One document's distinct hashes."""
        i = int(np.searchsorted(self.docs, doc))
        out: np.ndarray = self.values[self.offsets[i] : self.offsets[i + 1]]
        return out

    def jaccard(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Exact Jaccard similarity of the sets of docs a[i] and b[i] (1.0 for two empty sets).

        Raises:
            KeyError: a document without a set here.
        """
        if not self.covers(np.concatenate([a, b])):
            raise KeyError("a document of the pairs has no shingle set here")
        ra, rb = np.searchsorted(self.docs, a), np.searchsorted(self.docs, b)
        sizes = np.diff(self.offsets)
        la, lb = sizes[ra], sizes[rb]
        out = np.ones(len(ra), dtype=np.float64)
        cum = np.cumsum(la + lb)
        cuts = np.searchsorted(cum, np.arange(_PAIR_BLOCK, int(cum[-1]) if len(cum) else 0,
                                              _PAIR_BLOCK), side="right")  # fmt: skip
        bounds = [0, *sorted(set(np.clip(cuts, 1, len(ra)).tolist())), len(ra)]
        for p0, p1 in itertools.pairwise(bounds):
            if p1 > p0:
                out[p0:p1] = self._block(ra[p0:p1], rb[p0:p1], la[p0:p1], lb[p0:p1])
        return out

    def _block(self, ra: np.ndarray, rb: np.ndarray, la: np.ndarray, lb: np.ndarray) -> np.ndarray:
        pair = np.arange(len(ra), dtype=np.uint64) << _SHIFT
        keys = np.concatenate(
            [
                np.repeat(pair, la) | self.values[segments(self.offsets[ra], la)],
                np.repeat(pair, lb) | self.values[segments(self.offsets[rb], lb)],
            ]
        )
        keys.sort()
        same = keys[1:][keys[1:] == keys[:-1]]
        inter = np.bincount((same >> _SHIFT).astype(np.int64), minlength=len(ra))
        union = la + lb - inter
        out: np.ndarray = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        return out
