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


def _fmix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_signatures_equal_the_one_permutation_definition_and_empty_docs_are_max() -> None:
    docs = [*_random_docs(1, 30), "", "a b c", "one"]
    hasher = MinHasher(64, seed=3)
    h, off = shingle_hashes(docs, 3)
    sig = hasher.signatures(h, off)
    key, k = int(hasher.key()), hasher.num_perm
    probes = hasher.probes(0, 4096)
    for i, d in enumerate(docs):
        if not d:
            assert (sig[i] == 0xFFFFFFFF).all()
            continue
        ys = [_fmix32(int(v) ^ key) for v in h[off[i] : off[i + 1]]]
        bins: dict[int, int] = {}
        for y in ys:
            b = y * k >> 32
            bins[b] = min(bins.get(b, y), y)
        ref = [bins[b] if b in bins else bins[next(p for p in probes[b] if p in bins)]
               for b in range(k)]  # fmt: skip
        assert sig[i].tolist() == ref
    assert np.array_equal(compute_signatures(docs, hasher, ngram=3), sig)


def test_signatures_do_not_depend_on_the_shingle_block_size(monkeypatch) -> None:
    import llmctl.data.minhash as minhash

    h, off = shingle_hashes([*_random_docs(2, 20), "", "x y"], 3)
    want = MinHasher(48, seed=2).signatures(h, off)
    monkeypatch.setattr(minhash, "_SLOT_BLOCK", 7)  # documents straddle many blocks
    assert np.array_equal(MinHasher(48, seed=2).signatures(h, off), want)


def test_densification_past_the_probe_budget_takes_the_next_filled_bin(monkeypatch) -> None:
    import llmctl.data.minhash as minhash

    monkeypatch.setattr(minhash, "_MAX_PROBES", 0)  # the rare path: no probe hit a filled bin
    h, off = shingle_hashes(["a b c d e f g", "one"], 5)
    sig = MinHasher(32, seed=5).signatures(h, off)
    assert len(set(sig[1].tolist())) == 1  # one shingle fills every slot
    filled = [b for b in range(32) if b in {int(y) * 32 >> 32 for y in sig[0]}]
    want = [min(f for f in filled if f >= b) if b <= filled[-1] else filled[0] for b in range(32)]
    assert [int(sig[0, w]) for w in want] == sig[0].tolist()


def _overlapping_pairs(
    rng: np.random.Generator, n: int, sizes: tuple[int, int], sims: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n pairs of random 32-bit shingle sets; their exact Jaccard from Python sets."""
    parts, offsets, truth = [], [0], []
    for _ in range(n):
        size, j = int(rng.integers(*sizes, endpoint=True)), rng.uniform(*sims)
        common = min(round(size * 2 * j / (1 + j)), size)
        u = rng.integers(0, 2**32, size=2 * size - common, dtype=np.uint64).astype(np.uint32)
        a, b = u[:size], np.concatenate([u[:common], u[size:]])
        sa, sb = set(a.tolist()), set(b.tolist())
        truth.append(len(sa & sb) / len(sa | sb))
        parts += [a, b]
        offsets += [offsets[-1] + len(a), offsets[-1] + len(a) + len(b)]
    return np.concatenate(parts), np.array(offsets), np.array(truth)


def _bias(values: np.ndarray) -> tuple[float, float]:
    return float(values.mean()), float(values.std() / np.sqrt(len(values)))


@pytest.mark.parametrize("sizes", [(1, 8), (8, 60), (60, 400), (400, 1500)])
def test_each_slot_collides_with_probability_jaccard_and_bands_follow_the_s_curve(
    sizes: tuple[int, int],
) -> None:
    # tiny sets leave most of the 120 bins empty (densification), large ones none
    rng = np.random.default_rng(sizes[0])
    h, off, true = _overlapping_pairs(rng, 600, sizes, (0.05, 1.0))
    sig = MinHasher(120, seed=sizes[1]).signatures(h, off)
    slot_bias, se = _bias((sig[0::2] == sig[1::2]).mean(axis=1) - true)
    assert abs(slot_bias) < 4 * se and se < 0.003, (slot_bias, se)
    # the test has the power to see a broken estimator: 1/32 extra collisions per slot
    broken = (sig[0::2] % 32 == sig[1::2] % 32).mean(axis=1) - true
    assert _bias(broken)[0] > 4 * se
    # bands of 6 rows: P(band equal) = J**6 and P(candidate) = 1 - (1 - J**6)**20 (planner)
    h, off, true = _overlapping_pairs(rng, 600, sizes, (0.4, 0.9))
    eq = MinHasher(120, seed=sizes[1]).signatures(h, off)
    band = (eq[0::2] == eq[1::2]).reshape(len(true), 20, 6).all(axis=2)
    assert abs(_bias(band.mean(axis=1) - true**6)[0]) < 0.01
    cand_bias, cand_se = _bias(band.any(axis=1) - (1 - (1 - true**6) ** 20))
    assert abs(cand_bias) < 4 * cand_se, (cand_bias, cand_se)


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
