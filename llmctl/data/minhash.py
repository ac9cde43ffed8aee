"""Vectorised shingling, MinHash signatures and LSH banding, in numpy.

Why this shape: per-document Python loops cap MinHash at a few thousand documents per second.
Here a whole batch of documents is handled with array operations only:

1. Shingle hashes without Python loops. The batch is joined into one byte array. A polynomial
   hash of any byte range [s, e) is read off one prefix sum, all modulo 2**64 (numpy's native
   uint64 wrap-around): with Q[j] = byte[j] * P**-j and C = cumsum(Q),
   hash(s, e) = (C[e] - C[s]) * P**(e-1) = sum_j byte[j] * P**(e-1-j).  P is odd, hence
   invertible modulo 2**64. Words are the runs between ASCII whitespace; a word n-gram combines
   n consecutive word hashes with fixed odd multipliers; a character n-gram is hash(i, i+n) over
   UTF-8 bytes. A murmur3 finaliser mixes every hash; shingles are its high 32 bits. The result
   depends on the text alone (no per-process hash seed), so signatures computed on different
   machines agree, which the SLURM array path relies on.
2. Signatures by one-permutation hashing with optimal densification (Shrivastava 2017): each
   shingle hash is mixed once by a seeded bijection of 32-bit values, the value range is cut
   into `num_perm` bins, and a slot holds the smallest mixed value of the document's shingles in
   its bin (`np.minimum.at` over the whole batch). An empty bin takes the value of the first
   filled bin in a pseudo-random probe order that depends on the bin and the seed only. Two
   sets with Jaccard similarity J agree in each slot with probability J, as with `num_perm`
   independent permutations (tests/unit/data/test_minhash.py measures it against exact
   Jaccard on random pairs of 1 to 1,500 shingles), for one hash per shingle instead of
   `num_perm`. The earlier scheme (v1: `num_perm` affine permutations (a*x + b) mod 2**32,
   one minimum each) cost 8x more CPU here; `SIGNATURE_SCHEME` names the one in use.
3. LSH: a signature of `bands * rows` values is cut into bands; each band's rows are hashed to
   one 64-bit key; documents sharing a key in any band are candidates. The probability that a
   pair with Jaccard similarity s becomes a candidate is 1 - (1 - s**rows)**bands.
"""

from __future__ import annotations

import string
import unicodedata
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

_U64 = np.uint64
_P = _U64(0x100000001B3)  # the FNV-1a 64-bit prime: odd
_P_INV = _U64(pow(int(_P), -1, 1 << 64))
_FMIX_C1 = _U64(0xFF51AFD7ED558CCD)
_FMIX_C2 = _U64(0xC4CEB9FE1A85EC53)
_MAX_HASH = np.uint32(0xFFFFFFFF)
_BATCH_DOCS = 128


class ShingleUnit(StrEnum):
    """What an n-gram is made of."""

    WORD = "word"
    CHAR = "char"


@dataclass(frozen=True, slots=True)
class Normalization:
    """How text is normalised before hashing (both exact and fuzzy dedup)."""

    lowercase: bool = True
    strip_punctuation: bool = True
    collapse_whitespace: bool = True
    nfkc: bool = False


_PUNCT_TABLE = str.maketrans(dict.fromkeys(string.punctuation, " "))


def normalize(text: str, norm: Normalization) -> str:
    """Apply a normalisation to one text."""
    if norm.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if norm.lowercase:
        text = text.lower()
    if norm.strip_punctuation:
        text = text.translate(_PUNCT_TABLE)
    if norm.collapse_whitespace:
        text = " ".join(text.split())
    return text


_PUNCT_BYTES = bytes(ord(" ") if chr(b) in string.punctuation else b for b in range(256))
"""For `bytes.translate`: the byte-level part of normalisation, ASCII punctuation to space."""
_WS_FLAGS = bytes(1 if b in (9, 10, 11, 12, 13, 32) else 0 for b in range(256))
"""For `bytes.translate`: 1 for an ASCII whitespace byte, else 0 (a bool array in C speed)."""


def _whitespace(joined: bytes) -> np.ndarray:
    return np.frombuffer(joined.translate(_WS_FLAGS), dtype=bool)


def _collapse(data: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squeeze whitespace runs to one byte; map document bounds accordingly."""
    ws = _whitespace(data.tobytes())
    keep = ~(ws & np.concatenate([[True], ws[:-1]]))
    kept = np.concatenate([[0], np.cumsum(keep)])
    return data[keep], kept[bounds]


def fmix64(x: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place on a uint64 array; returns it."""
    x ^= x >> _U64(33)
    x *= _FMIX_C1
    x ^= x >> _U64(33)
    x *= _FMIX_C2
    x ^= x >> _U64(33)
    return x


def normalized_digests(texts: list[str], norm: Normalization) -> np.ndarray:
    """(len(texts), 2) uint64: xxh3-128 of each `normalize(text).encode()`, in batches.

    ASCII texts (all but NFKC) go through the joined bytes of their batch: lowercase, map
    punctuation and whitespace to spaces and squeeze space runs with array operations, then
    hash each document's slice; that is `normalize` exactly (on ASCII text, `str.split`
    splits on the bytes mapped to space here), without a Python object per word. Others take
    `normalize` itself.
    """
    import xxhash

    digests: list[bytes] = []
    for i in range(0, len(texts), _BATCH_DOCS):
        batch = texts[i : i + _BATCH_DOCS]
        fast = [j for j, t in enumerate(batch) if t.isascii() and not norm.nfkc]
        done = dict(zip(fast, _ascii_digests([batch[j] for j in fast], norm), strict=True))
        digests += [
            done[j] if j in done else xxhash.xxh3_128_digest(normalize(t, norm).encode("utf-8"))
            for j, t in enumerate(batch)
        ]
    out = np.frombuffer(b"".join(digests), dtype=">u8").astype(np.uint64)
    return out.reshape(len(texts), 2)


_EXACT_SPACE = bytes(32 if b in (9, 10, 11, 12, 13, 28, 29, 30, 31) else b for b in range(256))
"""ASCII whitespace as `str.split` sees it (including the separators 0x1c-0x1f) to space."""


def _ascii_digests(texts: list[str], norm: Normalization) -> list[bytes]:
    import xxhash

    if not texts:
        return []
    encoded = [t.encode("ascii") for t in texts]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    starts = np.zeros(len(encoded), dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    ends = starts + lengths
    joined = b"\n".join(encoded)
    if norm.lowercase:
        joined = joined.lower()
    if norm.strip_punctuation:
        joined = joined.translate(_PUNCT_BYTES)
    if norm.collapse_whitespace:
        joined, starts, ends = _squeeze(joined.translate(_EXACT_SPACE), starts, ends)
    view = memoryview(joined)
    return [
        xxhash.xxh3_128_digest(view[s:e])
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    ]


def _squeeze(
    joined: bytes, starts: np.ndarray, ends: np.ndarray
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Space runs to one space, no space at either end of a document (`" ".join(s.split())`)."""
    arr = np.frombuffer(joined, dtype=np.uint8)
    drop = arr == 32
    if len(drop) > 1:
        drop[1:] &= arr[:-1] == 32  # a space after a space; a leading space goes too
    removed = np.flatnonzero(drop)  # few: counting them beats a prefix sum over every byte
    squeezed = arr[~drop]
    s = starts - np.searchsorted(removed, starts)
    e = ends - np.searchsorted(removed, ends)
    if not len(squeezed):
        return b"", s, e
    nonempty = s < e
    s = s + (nonempty & (squeezed[np.minimum(s, len(squeezed) - 1)] == 32))
    nonempty = s < e
    e = e - (nonempty & (squeezed[np.maximum(e - 1, 0)] == 32))
    return squeezed.tobytes(), s, e


class _Powers:
    """Growing tables of P**i and P**-i modulo 2**64."""

    def __init__(self) -> None:
        self.pos = np.ones(1, dtype=np.uint64)
        self.neg = np.ones(1, dtype=np.uint64)

    def ensure(self, n: int) -> None:
        if len(self.pos) >= n:
            return
        size = max(n, 2 * len(self.pos))
        with np.errstate(over="ignore"):
            self.pos = np.cumprod(np.full(size, _P, dtype=np.uint64), dtype=np.uint64)
            self.pos = np.concatenate([[_U64(1)], self.pos[:-1]]).astype(np.uint64)
            self.neg = np.cumprod(np.full(size, _P_INV, dtype=np.uint64), dtype=np.uint64)
            self.neg = np.concatenate([[_U64(1)], self.neg[:-1]]).astype(np.uint64)


_POWERS = _Powers()
_GRAM_MULT = fmix64(np.arange(1, 65, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15)) | _U64(1)


def _join(texts: list[str], table: bytes | None = None) -> tuple[bytes, np.ndarray]:
    """The batch as one byte string (docs separated by a newline, `table` applied) and each
    doc's [start, end)."""
    encoded = [t.encode("utf-8") for t in texts]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    starts = np.zeros(len(encoded), dtype=np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    joined = b"\n".join(encoded)
    if table is not None:
        joined = joined.translate(table)
    return joined, np.stack([starts, starts + lengths], axis=1)


def _prefix(data: np.ndarray) -> np.ndarray:
    """C[0] = 0, C[j+1] = sum_{i<=j} data[i] * P**-i (one buffer, filled in place)."""
    _POWERS.ensure(len(data) + 1)
    c = np.empty(len(data) + 1, dtype=np.uint64)
    c[0] = 0
    np.multiply(data, _POWERS.neg[: len(data)], out=c[1:])
    np.cumsum(c, out=c)
    return c


def _range_hash(c: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    out: np.ndarray = (c[e] - c[s]) * _POWERS.pos[e - 1]
    return out


def shingle_hashes(
    texts: list[str],
    ngram: int = 5,
    unit: ShingleUnit = ShingleUnit.WORD,
    norm: Normalization | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Shingle hashes of a batch of texts, normalised on the way (`norm`, default none).

    Lowercasing and NFKC run per text in C (`str.lower`, `unicodedata`); punctuation and
    whitespace are handled on the joined bytes, so `normalize(text)` and this agree on words.

    Returns:
        (hashes, offsets): uint32 hashes of all shingles, document i's being
        hashes[offsets[i]:offsets[i+1]]. A text shorter than one n-gram gives one shingle made
        of all it has; an empty text gives none.
    """
    if not texts:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64)
    if norm is not None and (norm.lowercase or norm.nfkc):
        texts = [
            normalize(t, Normalization(norm.lowercase, False, False, norm.nfkc)) for t in texts
        ]
    strip = norm is not None and norm.strip_punctuation
    joined, bounds = _join(texts, _PUNCT_BYTES if strip else None)
    data = np.frombuffer(joined, dtype=np.uint8)
    if norm is not None and norm.collapse_whitespace and unit is ShingleUnit.CHAR:
        data, bounds = _collapse(data, bounds)
    c = _prefix(data)
    with np.errstate(over="ignore"):
        if unit is ShingleUnit.CHAR:
            h, doc = _char_grams(c, bounds, ngram)
        else:
            h, doc = _word_grams(joined, c, bounds, ngram)
        h = fmix64(h)
    counts = np.bincount(doc, minlength=len(texts))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return (h >> _U64(32)).astype(np.uint32), offsets


def _char_grams(c: np.ndarray, bounds: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = bounds[:, 1] - bounds[:, 0]
    per_doc = np.where(lengths >= n, lengths - n + 1, np.minimum(lengths, 1))
    doc = np.repeat(np.arange(len(bounds)), per_doc)
    first = np.repeat(bounds[:, 0] - np.concatenate([[0], np.cumsum(per_doc)[:-1]]), per_doc)
    s = first + np.arange(len(doc))
    e = np.minimum(s + n, bounds[doc, 1])
    return _range_hash(c, s, e), doc


def _word_grams(
    joined: bytes, c: np.ndarray, bounds: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    space = _whitespace(joined)
    edges = np.flatnonzero(space[1:] != space[:-1]) + 1
    if len(space) and not space[0]:
        edges = np.concatenate([[0], edges])
    if len(space) and not space[-1]:
        edges = np.concatenate([edges, [len(space)]])
    ws, we = edges[0::2], edges[1::2]
    wh = fmix64(_range_hash(c, ws, we))
    # documents are separated by whitespace, so each one's words are a contiguous run
    nwords = np.diff(np.searchsorted(ws, bounds[:, 0]), append=len(ws))
    wdoc = np.repeat(np.arange(len(bounds)), nwords)
    if len(wh) >= n:
        g = wh[: len(wh) - n + 1] * _GRAM_MULT[0]
        for k in range(1, n):
            g += wh[k : len(wh) - n + 1 + k] * _GRAM_MULT[k]
        keep = wdoc[: len(wh) - n + 1] == wdoc[n - 1 :]
        h, doc = g[keep], wdoc[: len(wh) - n + 1][keep]
    else:
        h, doc = np.zeros(0, np.uint64), np.zeros(0, np.int64)
    short = np.flatnonzero((nwords > 0) & (nwords < n))
    if len(short):
        h, doc = _add_short(h, doc, wh, nwords, short)
    return h, doc


def _add_short(
    h: np.ndarray, doc: np.ndarray, wh: np.ndarray, nwords: np.ndarray, short: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One shingle for each document with fewer words than the n-gram; keep doc order."""
    first = np.concatenate([[0], np.cumsum(nwords)[:-1]])
    extra = np.array(
        [
            np.sum(wh[first[d] : first[d] + nwords[d]] * _GRAM_MULT[: nwords[d]], dtype=np.uint64)
            for d in short
        ],
        dtype=np.uint64,
    )
    h, doc = np.concatenate([h, extra]), np.concatenate([doc, short])
    order = np.argsort(doc, kind="stable")
    return h[order], doc[order]


SIGNATURE_SCHEME = "oph-optimal-densification-v2"
"""Names the signature algorithm; recorded in the work folder's plan and the dedup report, so
that signatures made by another version are never mixed with these (v1: `num_perm` affine
permutations, one minimum each)."""

_FMIX32_C1 = np.uint32(0x85EBCA6B)
_FMIX32_C2 = np.uint32(0xC2B2AE35)
_PROBE_ROUNDS = 32
_SLOT_BLOCK = 1 << 20
_MAX_PROBES = 2048


def fmix32(x: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finaliser (a bijection of uint32 values), in place; returns it."""
    x ^= x >> np.uint32(16)
    x *= _FMIX32_C1
    x ^= x >> np.uint32(13)
    x *= _FMIX32_C2
    x ^= x >> np.uint32(16)
    return x


@dataclass(frozen=True, slots=True)
class MinHasher:
    """One-permutation hashing into `num_perm` bins with optimal densification.

    Each shingle hash x is hashed once: y = fmix32(x ^ key(seed)), a random bijection of
    32-bit values. The range of y is cut into `num_perm` equal bins; slot k of a document's
    signature is the smallest y of its shingles in bin k. A bin no shingle fell in borrows the
    value of another bin, chosen by probing bins in a fixed pseudo-random order that depends on
    the bin and the seed only (Shrivastava 2017, "Optimal densification for fast and accurate
    minwise hashing"). For two sets with Jaccard similarity J, every slot is equal with
    probability J, as with `num_perm` independent permutations, at the cost of one hash per
    shingle instead of `num_perm`.
    """

    num_perm: int = 128
    seed: int = 1

    def key(self) -> np.uint32:
        """The 32-bit value XORed into every shingle hash before mixing."""
        return np.uint32(int(fmix64(np.array([self.seed], dtype=np.uint64))[0]) & 0xFFFFFFFF)

    def probes(self, start: int, count: int) -> np.ndarray:
        """(num_perm, count) int64: the bins an empty bin tries, attempts start..start+count-1."""
        bins = np.arange(self.num_perm, dtype=np.uint64)[:, None] << np.uint64(32)
        tries = np.arange(start, start + count, dtype=np.uint64)[None, :]
        with np.errstate(over="ignore"):
            h = fmix64((bins | tries) ^ (np.uint64(self.seed) * _U64(0x9E3779B97F4A7C15)))
        return ((h >> np.uint64(32)) * np.uint64(self.num_perm) >> np.uint64(32)).astype(np.int64)

    def signatures(self, hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(num_docs, num_perm) uint32 signatures; an empty document gets all 0xFFFFFFFF."""
        k, num_docs = self.num_perm, len(offsets) - 1
        y = fmix32(np.asarray(hashes, dtype=np.uint32) ^ self.key())
        flat = np.full(num_docs * k, _MAX_HASH, dtype=np.uint32)
        filled = np.zeros(num_docs * k, dtype=bool)
        for start in range(0, len(y), _SLOT_BLOCK):  # bounded temporaries for huge documents
            part = y[start : start + _SLOT_BLOCK]
            within = np.diff(np.clip(offsets, start, start + len(part)))
            doc = np.repeat(np.arange(num_docs, dtype=np.int64), within)
            slot = doc * k + ((part.astype(np.uint64) * np.uint64(k)) >> np.uint64(32)).astype(
                np.int64
            )
            np.minimum.at(flat, slot, part)
            filled[slot] = True
        sig = flat.reshape(num_docs, k)
        self._densify(sig, filled.reshape(num_docs, k), offsets)
        return sig

    def _densify(self, sig: np.ndarray, filled: np.ndarray, offsets: np.ndarray) -> None:
        """Give each empty bin of a non-empty document the value of the first filled bin in
        its probe order."""
        docs, bins = np.nonzero(~filled & (offsets[1:] > offsets[:-1])[:, None])
        for start in range(0, _MAX_PROBES, _PROBE_ROUNDS):
            if not len(docs):
                return
            probe = self.probes(start, _PROBE_ROUNDS)[bins]
            hit = filled[docs[:, None], probe]
            found = hit.any(axis=1)
            src = probe[np.arange(len(docs)), hit.argmax(axis=1)]
            sig[docs[found], bins[found]] = sig[docs[found], src[found]]
            docs, bins = docs[~found], bins[~found]
        # p < 1e-7 per bin with one filled bin of 120: the next filled bin, cyclically
        for d, b in zip(docs.tolist(), bins.tolist(), strict=True):
            ring = np.roll(filled[d], -b)
            sig[d, b] = sig[d, (b + int(ring.argmax())) % self.num_perm]


def compute_signatures(
    texts: list[str],
    hasher: MinHasher,
    *,
    ngram: int = 5,
    unit: ShingleUnit = ShingleUnit.WORD,
    norm: Normalization | None = None,
) -> np.ndarray:
    """(len(texts), num_perm) signatures, in cache-sized batches of documents."""
    return hash_documents(texts, hasher, ngram=ngram, unit=unit, norm=norm).signatures


@dataclass(frozen=True, slots=True)
class Hashed:
    """Signatures of a list of documents and, if asked for, their shingle hashes."""

    signatures: np.ndarray
    """(num_docs, num_perm) uint32."""
    shingles: np.ndarray | None = None
    """uint32 shingle hashes of all documents, document i's at offsets[i]:offsets[i+1]."""
    offsets: np.ndarray | None = None
    """(num_docs + 1,) int64 offsets into `shingles`."""


def hash_documents(
    texts: list[str],
    hasher: MinHasher,
    *,
    ngram: int = 5,
    unit: ShingleUnit = ShingleUnit.WORD,
    norm: Normalization | None = None,
    keep_shingles: bool = False,
) -> Hashed:
    """Signatures in cache-sized batches; with `keep_shingles`, the shingle hashes too (one
    pass over the text serves both MinHash and exact Jaccard verification)."""
    sigs, hashes, counts = [], [], []
    for i in range(0, len(texts), _BATCH_DOCS):
        h, off = shingle_hashes(texts[i : i + _BATCH_DOCS], ngram, unit, norm)
        sigs.append(hasher.signatures(h, off))
        if keep_shingles:
            hashes.append(h)
            counts.append(np.diff(off))
    sig = np.concatenate(sigs) if sigs else np.zeros((0, hasher.num_perm), np.uint32)
    if not keep_shingles:
        return Hashed(sig)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    if counts:
        np.cumsum(np.concatenate(counts), out=offsets[1:])
    shingles = np.concatenate(hashes) if hashes else np.zeros(0, np.uint32)
    return Hashed(sig, shingles, offsets)


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(num_docs, bands) uint64 keys: each band's `rows` values hashed together.

    Raises:
        ValueError: the signature is shorter than bands * rows.
    """
    num_docs, num_perm = signatures.shape
    if bands * rows > num_perm:
        raise ValueError(f"bands*rows = {bands}*{rows} exceeds num_perm = {num_perm}")
    sig = signatures[:, : bands * rows].astype(np.uint64).reshape(num_docs, bands, rows)
    with np.errstate(over="ignore"):
        keys = np.zeros((num_docs, bands), dtype=np.uint64)
        for r in range(rows):
            keys = fmix64(keys ^ (sig[:, :, r] + _GRAM_MULT[r]))
        keys ^= np.arange(bands, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15)
    return keys


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
    """P(a pair with Jaccard `similarity` shares at least one band)."""
    return float(1.0 - (1.0 - similarity**rows) ** bands)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two shingle-hash sets."""
    ua, ub = np.unique(a), np.unique(b)
    if not len(ua) and not len(ub):
        return 1.0
    inter = len(np.intersect1d(ua, ub, assume_unique=True))
    return inter / (len(ua) + len(ub) - inter)
