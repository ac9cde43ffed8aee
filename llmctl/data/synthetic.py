"""Synthetic corpora with planted near-duplicates at known Jaccard similarity.

Used by the dedup quality test and benchmark. Each base document is a run of random words
from a large vocabulary (so unrelated documents share almost no shingles); its variant has
`m` words replaced by fresh ones, which removes up to `n` word n-grams per edit. The true
Jaccard similarity of every planted pair is computed exactly on plain Python sets of word
n-gram tuples, independently of the hashing under test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlantedCorpus:
    """Documents, planted (original, variant) index pairs, and their true Jaccard."""

    texts: list[str]
    pairs: list[tuple[int, int]]
    jaccard: list[float]


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The set of word n-grams (the whole text if it is shorter than n words)."""
    w = text.split()
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)} if len(w) >= n else {tuple(w)}


def true_jaccard(a: str, b: str, n: int) -> float:
    """Exact Jaccard similarity of two texts' word n-gram sets."""
    sa, sb = word_ngrams(a, n), word_ngrams(b, n)
    return len(sa & sb) / len(sa | sb)


def planted_corpus(
    num_bases: int = 500,
    words_per_doc: int = 300,
    min_jaccard: float = 0.3,
    ngram: int = 5,
    num_plain: int = 0,
    seed: int = 0,
) -> PlantedCorpus:
    """Bases, each followed by one variant aimed at a Jaccard drawn uniformly from
    [min_jaccard, 1], then `num_plain` documents without a planted partner. Words are lowercase
    ASCII letters, so normalisation leaves them unchanged.

    Replacing m well-spread words removes about m*n of the L = words-n+1 shingles and adds as
    many, so J = (L - m*n) / (L + m*n), i.e. m = L(1 - J) / (n(1 + J)); the true value is then
    measured, not assumed.
    """
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(50_000)]
    texts: list[str] = []
    pairs: list[tuple[int, int]] = []
    sims: list[float] = []
    for _ in range(num_bases):
        words = rng.choices(vocab, k=words_per_doc)
        variant = list(words)
        target = rng.uniform(min_jaccard, 1.0)
        shingles = words_per_doc - ngram + 1
        edits = round(shingles * (1 - target) / (ngram * (1 + target)))
        for pos in rng.sample(range(words_per_doc), edits):
            variant[pos] = "".join(rng.choices(letters, k=10))
        base_text, variant_text = " ".join(words), " ".join(variant)
        pairs.append((len(texts), len(texts) + 1))
        sims.append(true_jaccard(base_text, variant_text, ngram))
        texts.extend([base_text, variant_text])
    for _ in range(num_plain):
        texts.append(" ".join(rng.choices(vocab, k=words_per_doc)))
    return PlantedCorpus(texts, pairs, sims)
