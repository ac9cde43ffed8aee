"""Vectorised shingling and MinHash agree with plain-Python definitions."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from llmctl.data.minhash import (
    MinHasher,
    Normalization,
    ShingleUnit,
    band_keys,
    candidate_probability,
    compute_signatures,
    jaccard,
    normalize,
    normalized_digests,
    shingle_hashes,
)


def _random_docs(seed: int, n: int, words: int = 120) -> list[str]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("abcdefghij", k=rng.randint(1, 6))) for _ in range(3000)]
    return [" ".join(rng.choices(vocab, k=rng.randint(1, words))) for _ in range(n)]


def _py_shingles(text: str, n: int) -> set[tuple[str, ...]]:
    w = text.split()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)} if len(w) >= n else {tuple(w)}


def test_word_shingles_match_python_sets_and_batching() -> None:
    docs = [*_random_docs(0, 200), "", "one", "two words"]
    h, off = shingle_hashes(docs, 5)
    for i, d in enumerate(docs):
        mine = h[off[i] : off[i + 1]]
        assert len(np.unique(mine)) == (len(_py_shingles(d, 5)) if d else 0)
        alone, _ = shingle_hashes([d], 5)
        assert np.array_equal(alone, mine)


def test_char_shingles_count_distinct_byte_ngrams() -> None:
    docs = ["abcabcabd", "héllo wörld", "ab"]
    h, off = shingle_hashes(docs, 3, ShingleUnit.CHAR)
    for i, d in enumerate(docs):
        b = d.encode()
        grams = {b[j : j + 3] for j in range(len(b) - 2)} or {b}
        assert len(np.unique(h[off[i] : off[i + 1]])) == len(grams)


def test_normalisation_makes_case_and_punctuation_irrelevant() -> None:
    norm = Normalization()
    a, _ = shingle_hashes(["Hello, World!  This is   A test."], 2, norm=norm)
    b, _ = shingle_hashes(["hello world this is a test"], 2, norm=norm)
    assert np.array_equal(a, b)


def test_signatures_equal_the_formula_and_empty_docs_are_max() -> None:
    docs = [*_random_docs(1, 30), ""]
    hasher = MinHasher(64, seed=3)
    h, off = shingle_hashes(docs, 3)
    sig = hasher.signatures(h, off)
    a, b = hasher.params()
    assert a.dtype == np.uint32 and (a % 2 == 1).all()
    for i in range(len(docs) - 1):
        x = [int(v) for v in h[off[i] : off[i + 1]]]
        ref = [min((int(ak) * v + int(bk)) % 2**32 for v in x) for ak, bk in zip(a, b, strict=True)]
        assert sig[i].tolist() == ref
    assert (sig[-1] == 0xFFFFFFFF).all()
    assert np.array_equal(compute_signatures(docs, hasher, ngram=3), sig)


def test_signature_agreement_estimates_jaccard() -> None:
    rng = random.Random(4)
    base = _random_docs(5, 40, words=300)
    hasher = MinHasher(256)
    errors = []
    for doc in base:
        words = doc.split()
        for _ in range(rng.randint(0, 12)):
            words[rng.randrange(len(words))] = "zzz" + str(rng.random())
        pair = [doc, " ".join(words)]
        h, off = shingle_hashes(pair, 5)
        true = jaccard(h[off[0] : off[1]], h[off[1] : off[2]])
        sig = hasher.signatures(h, off)
        errors.append(np.mean(sig[0] == sig[1]) - true)
    # standard error at 256 permutations is at most 0.031; the mean error shows bias
    assert abs(np.mean(errors)) < 0.02 and np.max(np.abs(errors)) < 0.13


def test_band_keys_and_s_curve() -> None:
    sig = np.random.default_rng(0).integers(0, 2**32, size=(3, 12), dtype=np.uint32)
    sig[1] = sig[0]
    sig[2, :4] = sig[0, :4]
    keys = band_keys(sig, 3, 4)
    assert (keys[0] == keys[1]).all()
    assert keys[2, 0] == keys[0, 0] and (keys[2, 1:] != keys[0, 1:]).all()
    with pytest.raises(ValueError, match="exceeds num_perm"):
        band_keys(sig, 4, 4)
    assert candidate_probability(0.8, 20, 6) > 0.99 > candidate_probability(0.5, 20, 6)


def test_word_shingles_split_on_ascii_whitespace_only_at_any_position() -> None:
    """Words are runs between ASCII whitespace bytes (tab, newline, CR, VT, FF, space), at the
    start, the end and between documents of a batch alike; U+00A0 and U+3000 join words."""
    rng = random.Random(9)
    pieces = ["ab", "c", "déjà", "x\xa0y", "日本\u3000語", " ", "\t", "\n", "\r\n", "\x0b", "\x0c"]
    docs = ["".join(rng.choices(pieces, k=rng.randint(0, 12))) for _ in range(400)]
    h, off = shingle_hashes(docs, 2)
    for i, d in enumerate(docs):
        words = [w for w in re.split(rb"[\t\n\r\x0b\x0c ]+", d.encode()) if w]
        grams = {tuple(words[j : j + 2]) for j in range(len(words) - 1)} or (
            {tuple(words)} if words else set()
        )
        assert len(np.unique(h[off[i] : off[i + 1]])) == len(grams), repr(d)
        alone, _ = shingle_hashes([d], 2)  # first and last in its batch
        assert np.array_equal(alone, h[off[i] : off[i + 1]]), repr(d)


@pytest.mark.parametrize("flags", [(1, 1, 1, 0), (0, 0, 0, 0), (1, 0, 1, 0), (0, 1, 0, 0),
                                   (0, 0, 1, 0), (1, 1, 0, 0), (1, 1, 1, 1)])  # fmt: skip
def test_normalized_digests_hash_exactly_what_normalize_returns(flags: tuple[int, ...]) -> None:
    """The batched ASCII path agrees with `normalize` (Python's own str methods) on every
    ASCII character, runs of whitespace and punctuation at both ends, empty texts, and
    non-ASCII texts mixed into the same batch."""
    import xxhash

    norm = Normalization(*map(bool, flags))
    rng = random.Random(sum(flags))
    ascii_chars = [*(chr(c) for c in range(128)), "  ", "Ab", "\t\n"]
    texts = ["".join(rng.choices(ascii_chars, k=rng.randint(0, 40)))
             for _ in range(700)]  # fmt: skip
    texts += ["", " ", "  a  ", "...", "\x1c\x1f", "Déjà\xa0vu", "ｆｕｌｌ", "x\u3000y"]
    rng.shuffle(texts)
    got = normalized_digests(texts, norm)
    for t, g in zip(texts, got, strict=True):
        want = np.frombuffer(xxhash.xxh3_128_digest(normalize(t, norm).encode()), dtype=">u8")
        assert (g == want).all(), (repr(t), norm)
