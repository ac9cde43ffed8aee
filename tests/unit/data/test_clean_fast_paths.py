"""The quality filters' shortcuts equal the plain rules they skip, on inputs built to break them.

`text._split_simple` peels a common chunk's affixes at once instead of one character at a time
(`text._split_general`); Gopher repetition skips counting the n-grams whose rule a bound shows
cannot fire; duplicates, letterless words and bullet lines are counted with C-level builtins.
Each is compared here with the straightforward computation it replaces.
"""

from __future__ import annotations

import random
from collections import Counter

from llmctl.data.filters import text
from llmctl.data.filters.quality import NGrams, _num_without_letter, duplicates

PIECES = [
    *"aZ9é²_.,;:!?'\"()[]{}<>-–—#*&/@%+=$€…’“”`~^|\\",
    "word", "Dont", "cannot", "Im", "www", "com", "n't", "'s", "...", "e.g", "U.S", "xD",
    "and/or", "o.O", "8", ":)", "(:", "://", "org", "y'all",
]  # fmt: skip


def _chunks(num: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    chunks = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))) for _ in range(num)]
    affixes = "([{\"'#*<$%+"
    for special in sorted(text._KEEP | text._EMOTICONS | set(text._SPLIT)):
        for pre in ("", *affixes):
            for post in ("", ",", ")", ".", ").", "'", ":", "…"):
                chunks.append(pre + special + post)
    return [c for c in chunks if c and not any(ch.isspace() for ch in c)]


def test_split_simple_equals_the_general_loops() -> None:
    num_simple = 0
    for chunk in _chunks(60_000, 0):
        got = text._split_simple(chunk)
        if got is None:
            continue
        want: list[str] = []
        text._split_general(chunk, want)
        assert got == want, chunk
        num_simple += 1
    assert num_simple > 20_000  # the shortcut is taken, special cases included


def test_split_words_pieces_spell_the_chunk() -> None:
    # the emoticon join looks for emoticons in the chunk: the pieces must spell it
    for chunk in _chunks(20_000, 1):
        assert "".join(text._split_chunk(chunk)) == chunk, chunk


def test_duplicates_and_letterless_words_equal_loops() -> None:
    rng = random.Random(2)
    for _ in range(3000):
        items = [rng.choice(["a", "bb", "", "a b", "é", "12", "x1", "²", "-", "…", "_a_", "１"])
                 for _ in range(rng.randint(1, 30))]  # fmt: skip
        seen: set[str] = set()
        num = chars = 0
        for x in items:
            if x in seen:
                num, chars = num + 1, chars + len(x)
            seen.add(x)
        assert duplicates(items) == (num, chars)
        words = [w for w in items if w]
        want = sum(not any(c.isalpha() for c in w) for w in words)
        assert _num_without_letter(Counter(words)) == want


def test_top_chars_bound_holds() -> None:
    rng = random.Random(3)
    alphabet = ["a", "b", "ab", "the", "x" * 15, ".", ","]
    for _ in range(3000):
        words = [rng.choice(alphabet[: rng.randint(1, 7)]) for _ in range(rng.randint(0, 40))]
        grams = NGrams(words)
        for n in rng.sample(range(1, 7), 4):
            exact = NGrams(words).top_chars(n)
            assert all(exact <= b for b in grams.top_chars_bounds(n)), (words, n)
            assert grams.top_chars(n) == exact
            counts = Counter(zip(*(words[i:] for i in range(n)), strict=False))
            if counts:  # datatrove's choice: most_common(1), joined with spaces
                gram, count = counts.most_common(1)[0]
                assert exact == count * (sum(map(len, gram)) + n - 1)
