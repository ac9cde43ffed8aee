"""The published heuristic quality filters: Gopher quality and repetition, C4, FineWeb.

Each filter is a mutable config dataclass (its published defaults, every threshold a field;
`None` turns a rule off) with `check(doc) -> reason | None`. The rules and their order are
those of datatrove 0.10 (`datatrove.pipeline.filters`), the reference implementation, read
from its source; the reason strings are datatrove's, so reports compare one to one.

Sources: Gopher (Rae et al. 2021, arXiv:2112.11446, section A.1.1 and table A1), C4 (Raffel
et al. 2020, JMLR 21(140), section 2.2, and tensorflow_datasets c4_utils), FineWeb (Penedo et
al. 2024, arXiv:2406.17557, section 3.3). Deliberate differences from datatrove: words come
from `text.split_words` (see its module docstring), and a document with no words at all is
rejected as `gopher_short_doc` even when the word-count rule is off (datatrove divides by
zero there).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate, compress, filterfalse, islice, pairwise
from operator import methodcaller, mul, sub

from llmctl.data.filters.text import (
    PUNCTUATION,
    TERMINAL_PUNCTUATION,
    count_sentences,
    split_words,
)


class Doc:
    """A document's text with its words computed once for all filters."""

    __slots__ = ("_counts", "_words", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._words: list[str] | None = None
        self._counts: Counter[str] | None = None

    @property
    def words(self) -> list[str]:
        """`split_words(text)`, cached (reset when a filter rewrites the text)."""
        if self._words is None:
            self._words = split_words(self.text)
        return self._words

    @property
    def word_counts(self) -> Counter[str]:
        """How often each word occurs, cached like `words`."""
        if self._counts is None:
            self._counts = Counter(self.words)
        return self._counts

    def rewrite(self, text: str) -> None:
        """Replace the text (C4 keeps only its good lines; PII placeholders)."""
        if text != self.text:
            self.text, self._words, self._counts = text, None, None


GOPHER_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
_STARTS_BULLET = methodcaller("startswith", ("•", "-"))
_ENDS_ELLIPSIS = methodcaller("endswith", ("...", "…"))
assert not any(map(str.isalpha, PUNCTUATION))


def _num_without_letter(counts: Counter[str]) -> int:
    """Words (counted with repeats) holding no letter (`str.isalpha`): punctuation and digit
    words, and the other non-alphabetic words where no character is a letter."""
    non_alpha = list(filterfalse(str.isalpha, counts))
    rest = filterfalse(PUNCTUATION.issuperset, non_alpha)
    mixed = list(filterfalse(str.isdigit, rest))
    no_letter = [w for w in mixed if not any(map(str.isalpha, w))]
    num = counts.__getitem__
    return sum(map(num, non_alpha)) - sum(map(num, mixed)) + sum(map(num, no_letter))


@dataclass(kw_only=True)
class GopherQualityConfig:
    """Gopher's document quality rules (Rae et al. 2021, A.1.1)."""

    min_doc_words: int | None = 50
    """Fewer words (punctuation-only words not counted) rejects: gopher_short_doc."""
    max_doc_words: int | None = 100_000
    """More words rejects: gopher_long_doc."""
    min_avg_word_length: float | None = 3
    """Mean word length below this rejects: gopher_below_avg_threshold."""
    max_avg_word_length: float | None = 10
    """Mean word length above this rejects: gopher_above_avg_threshold."""
    max_symbol_word_ratio: float | None = 0.1
    """'#' per word, or '...' and '…' per word, above this rejects (too_many_hashes/ellipsis)."""
    max_bullet_lines_ratio: float | None = 0.9
    """Share of lines starting with '•' or '-' above this rejects: gopher_too_many_bullets."""
    max_ellipsis_lines_ratio: float | None = 0.3
    """Share of lines ending in '...' or '…' above this rejects: gopher_too_many_end_ellipsis."""
    max_non_alpha_words_ratio: float | None = 0.8
    """Share of words with a letter *below* this rejects: gopher_below_alpha_threshold
    (datatrove's name; the rule is a minimum)."""
    min_stop_words: int | None = 2
    """Fewer distinct stop words rejects: gopher_enough_stop_words."""
    stop_words: list[str] = field(default_factory=lambda: list(GOPHER_STOP_WORDS))
    """The stop words (exact, case-sensitive matches)."""

    def check(self, doc: Doc) -> str | None:
        """The reason to reject `doc`, or None to keep it."""
        text, words = doc.text, doc.words
        if not words:
            return "gopher_short_doc"
        # words made of punctuation only are not counted; only non-alphanumeric words can be
        counts = doc.word_counts
        punct = list(filter(PUNCTUATION.issuperset, filterfalse(str.isalnum, counts)))
        num_punct = list(map(counts.__getitem__, punct))
        num_words = len(words) - sum(num_punct)
        if self.min_doc_words and num_words < self.min_doc_words:
            return "gopher_short_doc"
        if self.max_doc_words and num_words > self.max_doc_words:
            return "gopher_long_doc"
        num_chars = len("".join(words)) - sum(map(mul, map(len, punct), num_punct))
        return (
            self._lengths(num_words, num_chars)
            or self._symbols(text, words)
            or self._words(words, counts)
        )

    def _lengths(self, num_words: int, num_chars: int) -> str | None:
        if not num_words:
            return None
        mean = num_chars / num_words
        if self.min_avg_word_length and mean < self.min_avg_word_length:
            return "gopher_below_avg_threshold"
        if self.max_avg_word_length and mean > self.max_avg_word_length:
            return "gopher_above_avg_threshold"
        return None

    def _symbols(self, text: str, words: list[str]) -> str | None:
        n = len(words)
        if self.max_symbol_word_ratio:
            if text.count("#") / n > self.max_symbol_word_ratio:
                return "gopher_too_many_hashes"
            if (text.count("...") + text.count("…")) / n > self.max_symbol_word_ratio:
                return "gopher_too_many_ellipsis"
        lines = text.splitlines() or [""]
        if self.max_bullet_lines_ratio:
            bullets = sum(map(_STARTS_BULLET, map(str.lstrip, lines)))
            if bullets / len(lines) > self.max_bullet_lines_ratio:
                return "gopher_too_many_bullets"
        if self.max_ellipsis_lines_ratio:
            ends = sum(map(_ENDS_ELLIPSIS, map(str.rstrip, lines)))
            if ends / len(lines) > self.max_ellipsis_lines_ratio:
                return "gopher_too_many_end_ellipsis"
        return None

    def _words(self, words: list[str], counts: Counter[str]) -> str | None:
        if self.max_non_alpha_words_ratio:
            alpha = len(words) - _num_without_letter(counts)
            if alpha / len(words) < self.max_non_alpha_words_ratio:
                return "gopher_below_alpha_threshold"
        if self.min_stop_words:
            found = set(self.stop_words).intersection(counts)
            if len(found) < self.min_stop_words:
                return "gopher_enough_stop_words"
        return None


def duplicates(items: list[str]) -> tuple[int, int]:
    """(items seen before, their total characters), in order: every occurrence of an item
    but its first, so all items less the distinct ones."""
    distinct = set(items)
    num = len(items) - len(distinct)
    return num, (sum(map(len, items)) - sum(map(len, distinct)) if num else 0)


WINDOW_CHARS = 12
"""Characters of the window at each word start that screens duplicated n-grams (below)."""


class NGrams:
    """The word n-gram counts of one document, sharing work across n (Gopher repetition).

    `top_chars(n)` counts word tuples, as datatrove counts its space-joined n-grams (words hold
    no whitespace, so equal tuples and equal strings are the same thing). `duplicated_chars(n)`
    follows datatrove's walk over n-grams joined *without* spaces, where different tuples can
    spell the same string (`ab c` and `a bc`), so it compares strings, but only at the word
    positions that can hold a repeat: two equal n-grams of at least `WINDOW_CHARS` characters
    start with the same `WINDOW_CHARS` characters, so a position whose window occurs at no
    other word start holds a string found nowhere else, and the walk skips it (it would only
    add a string no later n-gram can match). The windows are cut once for every n; positions
    whose n-gram is shorter than a window are always walked. Most documents have no repeated
    window, and then no n-gram is built at all.
    """

    __slots__ = (
        "_counts",
        "_joined",
        "_max_count",
        "_offsets",
        "_repeats",
        "_short",
        "_word_chars",
        "words",
    )

    def __init__(self, words: list[str], counts: Counter[str] | None = None) -> None:
        self.words = words
        self._counts = counts  # Counter(words), when the caller has it
        self._offsets: list[int] | None = None
        self._joined = ""
        self._repeats: list[int] | None = None
        self._short: dict[int, list[int]] = {}
        self._max_count: dict[int, int] = {}
        self._word_chars: int | None = None

    def top_chars(self, n: int) -> int:
        """Characters covered by the most frequent word n-gram (joined with spaces) times its
        count; ties go to the n-gram seen first (datatrove's `find_top_duplicate`)."""
        words = self.words
        if len(words) < n or n < 1:
            return 0
        if 1 in (self._max_count.get(j) for j in range(1, n)):
            # no shorter n-gram repeats, so no n-gram does: the first one is the most frequent
            self._max_count[n] = 1
            return sum(map(len, words[:n])) + n - 1
        grams = pairwise(words) if n == 2 else zip(*(words[i:] for i in range(n)), strict=False)
        counts: Counter[tuple[str, ...]] = Counter(grams)
        values = list(counts.values())
        count = self._max_count[n] = max(values)
        # the first key counted `count` times: `Counter.most_common(1)`'s choice
        gram = next(islice(counts, values.index(count), None))
        return (sum(map(len, gram)) + n - 1) * count

    def top_chars_bounds(self, n: int) -> Iterator[int]:
        """Upper bounds of `top_chars(n)` found without counting n-grams, cheapest first.

        The most frequent n-gram occurs c times, at c positions, and c is at most the top
        count of any shorter n-gram (its first words occur wherever it does) or of a word.
        Each of its n words w then fills c * len(w) <= count(w) * len(w) characters, so
        top_chars(n) <= n * max(count(w) * len(w)) + (n - 1) * c; and it is at most c times
        the longest n-gram.
        """
        m = len(self.words) - n + 1
        if m <= 0 or n < 1:
            return
        top_word, top_word_chars = self._word_counts()
        count = min([c for j, c in self._max_count.items() if j < n], default=top_word)
        yield n * top_word_chars + (n - 1) * count
        offsets = self._word_offsets()
        yield count * (max(map(sub, offsets[n:], offsets[:m])) + n - 1)

    def _word_counts(self) -> tuple[int, int]:
        """The top count of a word, and the most characters one word fills (count * length);
        the first is the top count of 1-grams, recorded as such."""
        if self._word_chars is None:
            counts = self._counts if self._counts is not None else Counter(self.words)
            self._max_count[1] = max(counts.values())
            self._word_chars = max(map(mul, counts.values(), map(len, counts)))
        return self._max_count[1], self._word_chars

    def duplicated_chars(self, n: int) -> int:
        """Characters of n-grams (words joined without spaces) that repeat an earlier n-gram;
        a repeat skips its n words, so no character counts twice (datatrove's
        `find_all_duplicate`)."""
        m = len(self.words) - n + 1
        if m <= 0 or n < 1:
            return 0
        offsets, repeats = self._screen()
        short = self._short_starts(n, m, offsets)
        if not short and not repeats:
            return 0
        starts = sorted({*short, *repeats}) if short else repeats
        joined = self._joined
        seen: set[str] = set()
        chars = next_free = 0
        for i in starts:
            if i >= m:
                break
            if i < next_free:
                continue
            gram = joined[offsets[i] : offsets[i + n]]
            if gram in seen:
                chars += len(gram)
                next_free = i + n
            else:
                seen.add(gram)
        return chars

    def _screen(self) -> tuple[list[int], list[int]]:
        """Word start offsets in the joined words, and the word positions whose window
        occurs at another word start too."""
        if self._repeats is None:
            offsets = self._word_offsets()
            joined = self._joined = "".join(self.words)
            k = WINDOW_CHARS
            windows = [joined[o : o + k] for o in offsets[:-1]]
            counts = Counter(windows)
            if len(counts) == len(windows):
                self._repeats = []
            else:
                repeated = map((1).__lt__, map(counts.__getitem__, windows))
                self._repeats = list(compress(range(len(windows)), repeated))
        return self._word_offsets(), self._repeats

    def _word_offsets(self) -> list[int]:
        """Where each word starts in the words joined without spaces (and their length)."""
        if self._offsets is None:
            self._offsets = list(accumulate(map(len, self.words), initial=0))
        return self._offsets

    def _short_starts(self, n: int, m: int, offsets: list[int]) -> list[int]:
        """Positions (< m) whose n-gram is shorter than a window, from those of a smaller n
        when known (a shorter n-gram is a prefix, so the set only shrinks as n grows)."""
        got = self._short.get(n)
        if got is None:
            k = WINDOW_CHARS
            below = [j for j in self._short if j < n]
            if below:
                pool = self._short[max(below)]
                got = [i for i in pool if i < m and offsets[i + n] - offsets[i] < k]
            else:
                short = map(k.__gt__, map(sub, offsets[n:], offsets[:m]))
                got = list(compress(range(m), short))
            self._short[n] = got
        return got


def top_ngram_chars(words: list[str], n: int) -> int:
    """`NGrams(words).top_chars(n)`."""
    return NGrams(words).top_chars(n)


def duplicated_ngram_chars(words: list[str], n: int) -> int:
    """`NGrams(words).duplicated_chars(n)`."""
    return NGrams(words).duplicated_chars(n)


_PARAGRAPHS = re.compile(r"\n{2,}")


def split_lines(text: str) -> list[str]:
    """`re.split(r"\n+", text)` (datatrove's line splitter) with `str.split`: the empty
    strings between newlines go, an empty first or last piece stays."""
    parts = text.split("\n")
    if len(parts) < 3 or all(parts):
        return parts
    return [parts[0], *filter(None, parts[1:-1]), parts[-1]]


@dataclass(kw_only=True)
class GopherRepetitionConfig:
    """Gopher's repetition rules (Rae et al. 2021, table A1)."""

    dup_line_frac: float | None = 0.3
    """Share of lines that repeat an earlier line, above which: dup_line_frac."""
    dup_para_frac: float | None = 0.3
    """Share of paragraphs that repeat an earlier one, above which: dup_para_frac."""
    dup_line_char_frac: float | None = 0.2
    """Characters in repeated lines / all characters, above which: dup_line_char_frac."""
    dup_para_char_frac: float | None = 0.2
    """Characters in repeated paragraphs / all characters, above which: dup_para_char_frac."""
    top_n_grams: list[list[float]] = field(default_factory=lambda: [[2, 0.2], [3, 0.18], [4, 0.16]])
    """[n, max share of characters in the most frequent n-gram]: top_{n}_gram."""
    dup_n_grams: list[list[float]] = field(
        default_factory=lambda: [[5, 0.15], [6, 0.14], [7, 0.13], [8, 0.12], [9, 0.11], [10, 0.1]]
    )
    """[n, max share of characters in repeated n-grams]: duplicated_{n}_n_grams."""

    def check(self, doc: Doc) -> str | None:
        """The reason to reject `doc`, or None to keep it."""
        text = doc.text
        if not text:
            return "empty"
        stripped = text.strip()
        paras = _PARAGRAPHS.split(stripped) if "\n\n" in stripped else [stripped]
        num, chars = duplicates(paras)
        if self.dup_para_frac and num / len(paras) > self.dup_para_frac:
            return "dup_para_frac"
        if self.dup_para_char_frac and chars / len(text) > self.dup_para_char_frac:
            return "dup_para_char_frac"
        lines = split_lines(text)
        num, chars = duplicates(lines)
        if self.dup_line_frac and num / len(lines) > self.dup_line_frac:
            return "dup_line_frac"
        if self.dup_line_char_frac and chars / len(text) > self.dup_line_char_frac:
            return "dup_line_char_frac"
        return self._ngrams(NGrams(doc.words, doc.word_counts), len(text))

    def _ngrams(self, grams: NGrams, num_chars: int) -> str | None:
        for n, frac in self.top_n_grams:
            if any(b / num_chars <= frac for b in grams.top_chars_bounds(int(n))):
                continue  # top_chars(n) <= a bound: the rule cannot fire
            if grams.top_chars(int(n)) / num_chars > frac:
                return f"top_{int(n)}_gram"
        for n, frac in self.dup_n_grams:
            if grams.duplicated_chars(int(n)) / num_chars > frac:
                return f"duplicated_{int(n)}_n_grams"
        return None


_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
C4_END_PUNCTUATION = (".", "?", "!", '"', "'")
C4_POLICY_SUBSTRINGS = (
    "terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
    "use cookies",
)  # fmt: skip


@dataclass(kw_only=True)
class C4Config:
    """C4's line and page rules (Raffel et al. 2020, 2.2; c4_utils in tensorflow_datasets).

    Lines failing a line rule are removed from the document; a page rule rejects it. The
    bad-words list rule is not implemented (as in datatrove's C4QualityFilter).
    """

    remove_citations: bool = True
    """Delete Wikipedia-style citation marks ([1], [edit], [citation needed]) from lines."""
    filter_no_terminal_punct: bool = True
    """Remove lines not ending in . ? ! " ' (or ending in '...')."""
    min_num_sentences: int = 5
    """Fewer sentences in the kept lines rejects: too_few_sentences (-1: off)."""
    min_words_per_line: int = 3
    """Remove lines with fewer whitespace-separated words (-1: off)."""
    max_word_length: int = 1000
    """Remove lines holding a longer word (-1: off)."""
    filter_lorem_ipsum: bool = True
    """A kept line containing 'lorem ipsum' rejects: lorem_ipsum."""
    filter_javascript: bool = True
    """Remove lines mentioning 'javascript'."""
    filter_curly_bracket: bool = True
    """A kept line containing '{' rejects: curly_bracket."""
    filter_policy: bool = True
    """Remove lines with terms-of-use, privacy or cookie phrases."""

    def check(self, doc: Doc) -> str | None:
        """The reason to reject `doc`, or None (then `doc` holds only its kept lines)."""
        kept: list[str] = []
        sentences = 0
        for raw in doc.text.splitlines():
            marked = line = raw.strip()
            if self.remove_citations and "[" in line:  # every citation mark starts with one
                line = _CITATION.sub("", line)
            verdict = self._line(line, marked)
            if verdict is None:
                continue
            if verdict != "keep":
                return verdict
            if self.min_num_sentences != -1:
                sentences += count_sentences(split_words(line))
            kept.append(line)
        if sentences < self.min_num_sentences:
            return "too_few_sentences"
        doc.rewrite("\n".join(kept).strip())
        return None

    def _line(self, line: str, marked: str) -> str | None:
        """'keep', None (drop the line) or a reason to reject the page; `line` is without
        its citation marks, `marked` with them. The first three rules only drop the line,
        so their order is free: the cheapest goes first."""
        if self.filter_no_terminal_punct and (
            not line.endswith(C4_END_PUNCTUATION) or line.endswith("...")
        ):
            return None
        words = marked.split()
        if self.max_word_length != -1 and words and max(map(len, words)) > self.max_word_length:
            return None
        if len(words) < self.min_words_per_line:
            return None
        low = line.lower()
        if self.filter_lorem_ipsum and "lorem ipsum" in low:
            return "lorem_ipsum"
        if self.filter_javascript and "javascript" in low:
            return None
        if self.filter_curly_bracket and "{" in line:
            return "curly_bracket"
        if self.filter_policy and any(p in low for p in C4_POLICY_SUBSTRINGS):
            return None
        return "keep"


@dataclass(kw_only=True)
class FineWebConfig:
    """FineWeb's own quality rules (Penedo et al. 2024, 3.3)."""

    line_punct_thr: float = 0.12
    """Share of lines ending in terminal punctuation below which: line_punct_ratio."""
    line_punct_exclude_zero: bool = False
    """Do not reject documents where no line ends in punctuation."""
    short_line_thr: float = 0.67
    """Share of short lines above which: short_line_ratio."""
    short_line_length: int = 30
    """A line of at most this many characters is short."""
    char_duplicates_ratio: float = 0.01
    """Characters in repeated lines / characters (newlines excluded), above which:
    char_dup_ratio."""
    new_line_ratio: float = 0.3
    """Newlines per word above which: list_ratio."""
    stop_chars: str | None = None
    """Characters that end a line well (None: Unicode sentence terminals)."""

    def check(self, doc: Doc) -> str | None:
        """The reason to reject `doc`, or None to keep it."""
        text = doc.text
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return "empty"
        stops = TERMINAL_PUNCTUATION if self.stop_chars is None else frozenset(self.stop_chars)
        ratio = sum(1 for line in lines if line[-1] in stops) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return "line_punct_ratio"
        ratio = sum(1 for line in lines if len(line) <= self.short_line_length) / len(lines)
        if ratio > self.short_line_thr:
            return "short_line_ratio"
        if duplicates(lines)[1] / (len(text) - text.count("\n")) > self.char_duplicates_ratio:
            return "char_dup_ratio"
        words = doc.words
        if not words or text.count("\n") / len(words) > self.new_line_ratio:
            return "list_ratio"
        return None


@dataclass(kw_only=True)
class CharsetConfig:
    """Character-class limits for code or text corpora (off unless a limit is set)."""

    max_non_ascii_ratio: float | None = None
    """Share of non-ASCII characters above which: non_ascii_ratio."""
    max_digit_ratio: float | None = None
    """Share of digits above which: digit_ratio."""
    max_symbol_ratio: float | None = None
    """Share of characters that are neither letters, digits nor whitespace: symbol_ratio."""

    def check(self, doc: Doc) -> str | None:
        """The reason to reject `doc`, or None to keep it."""
        text = doc.text
        n = len(text) or 1
        if self.max_non_ascii_ratio is not None:
            non_ascii = 0 if text.isascii() else sum(1 for c in text if ord(c) > 127)
            if non_ascii / n > self.max_non_ascii_ratio:
                return "non_ascii_ratio"
        digits = 0 if self.max_digit_ratio is None else sum(1 for c in text if c.isdigit())
        if self.max_digit_ratio is not None and digits / n > self.max_digit_ratio:
            return "digit_ratio"
        if self.max_symbol_ratio is not None:
            symbols = sum(1 for c in text if not (c.isalnum() or c.isspace()))
            if symbols / n > self.max_symbol_ratio:
                return "symbol_ratio"
        return None
