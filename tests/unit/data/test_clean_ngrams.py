"""The fast Gopher repetition counts equal datatrove's own functions, exactly.

`NGrams` screens duplicated n-grams with windows of characters and skips counting when no
shorter n-gram repeats (llmctl/data/filters/quality.py); these tests feed it word lists built
to defeat such shortcuts (words that join into the same string with different boundaries,
n-grams shorter than a window, long runs of one word) and compare every count with
datatrove's `find_all_duplicate`, `find_top_duplicate` and line splitter, the oracle.
"""

from __future__ import annotations

import random
import re

import pytest

from llmctl.data.filters.quality import WINDOW_CHARS, NGrams, split_lines

rep = pytest.importorskip(
    "datatrove.pipeline.filters.gopher_repetition_filter",
    reason="datatrove is not installed (pip install 'llmctl[dev]')",
)

LONG = "w" * WINDOW_CHARS
ALPHABET = ["a", "b", "ab", "ba", "aab", ".", "a.", "bb", LONG, LONG + "a", "a" + LONG, "é"]


def _top(words: list[str], n: int) -> int:
    grams = rep.get_n_grams(words, n)
    return rep.find_top_duplicate(grams) if grams else 0


def test_counts_equal_datatrove_on_adversarial_words() -> None:
    rng = random.Random(0)
    checked = nonzero = 0
    for _ in range(1500):
        words = [rng.choice(ALPHABET[: rng.randint(2, len(ALPHABET))])
                 for _ in range(rng.randint(0, 50))]  # fmt: skip
        grams = NGrams(words)  # one object for several n, in random order, as a filter uses it
        for n in rng.sample(range(1, 12), 5):
            if rng.random() < 0.5:
                got, want = grams.top_chars(n), _top(words, n)
            else:
                got, want = grams.duplicated_chars(n), rep.find_all_duplicate(words, n)
            assert got == want, (words, n, got, want)
            checked += 1
            nonzero += want > 0
    assert nonzero > checked // 4  # the lists do repeat


def test_joined_strings_repeat_across_word_boundaries() -> None:
    # "ab"+"c"+... and "a"+"bc"+... spell the same 2-gram string: datatrove counts it
    words = ["ab", "c", "x", "a", "bc", "y"] * 3
    for n in (2, 3, 5):
        assert NGrams(words).duplicated_chars(n) == rep.find_all_duplicate(words, n)
    assert NGrams(["ab", "c", "a", "bc"]).duplicated_chars(2) == 3


def test_split_lines_is_datatrove_regex() -> None:
    rng = random.Random(1)
    for _ in range(5000):
        text = "".join(rng.choice("ab\n\n \r") for _ in range(rng.randint(0, 12)))
        assert split_lines(text) == re.split(r"\n+", text), repr(text)
