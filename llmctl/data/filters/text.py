"""Words, lines and sentences for the quality filters: one fast tokeniser shared by all.

Why a tokeniser of our own. The published heuristics count *words*, and datatrove (the
reference implementation, `datatrove.utils.text.split_into_words`) takes them from spaCy's
blank English tokeniser: whitespace splitting, then punctuation prefixes and suffixes,
contractions (`don't` -> `do`, `n't`), infixes (hyphens between letters, `a/b`), and special
cases (`e.g.`, `U.S.`, URLs). Running spaCy costs more than every filter together, so
`split_words` reproduces those rules with string methods and three regular expressions; the
parity test (tests/unit/data/test_clean_parity.py) measures where the two tokenisers differ
and shows that, given the same words, every filter decides exactly as datatrove does.

The character tables are datatrove's (facts, listed here as code point ranges):
`TERMINAL_PUNCTUATION` is Unicode's Sentence_Terminal property (as of Unicode 15) plus the
Khmer signs U+17D6, U+17D9 and U+17DA; `PUNCTUATION` adds ASCII and CJK punctuation and the C0
and C1 control characters other than tab and newline.
"""

from __future__ import annotations

import re
import unicodedata

_TERMINAL_RANGES = (
    (0x21, 0x21), (0x2E, 0x2E), (0x3F, 0x3F), (0x589, 0x589), (0x61D, 0x61F), (0x6D4, 0x6D4),
    (0x700, 0x702), (0x7F9, 0x7F9), (0x837, 0x837), (0x839, 0x839), (0x83D, 0x83E),
    (0x964, 0x965), (0x104A, 0x104B), (0x1362, 0x1362), (0x1367, 0x1368), (0x166E, 0x166E),
    (0x1735, 0x1736), (0x17D4, 0x17D6), (0x17D9, 0x17DA), (0x1803, 0x1803), (0x1809, 0x1809),
    (0x1944, 0x1945), (0x1AA8, 0x1AAB), (0x1B5A, 0x1B5B), (0x1B5E, 0x1B5F), (0x1B7D, 0x1B7E),
    (0x1C3B, 0x1C3C), (0x1C7E, 0x1C7F), (0x203C, 0x203D), (0x2047, 0x2049), (0x2E2E, 0x2E2E),
    (0x2E3C, 0x2E3C), (0x2E53, 0x2E54), (0x3002, 0x3002), (0xA4FF, 0xA4FF), (0xA60E, 0xA60F),
    (0xA6F3, 0xA6F3), (0xA6F7, 0xA6F7), (0xA876, 0xA877), (0xA8CE, 0xA8CF), (0xA92F, 0xA92F),
    (0xA9C8, 0xA9C9), (0xAA5D, 0xAA5F), (0xAAF0, 0xAAF1), (0xABEB, 0xABEB), (0xFE52, 0xFE52),
    (0xFE56, 0xFE57), (0xFF01, 0xFF01), (0xFF0E, 0xFF0E), (0xFF1F, 0xFF1F), (0xFF61, 0xFF61),
    (0x10A56, 0x10A57), (0x10F55, 0x10F59), (0x10F86, 0x10F89), (0x11047, 0x11048),
    (0x110BE, 0x110C1), (0x11141, 0x11143), (0x111C5, 0x111C6), (0x111CD, 0x111CD),
    (0x111DE, 0x111DF), (0x11238, 0x11239), (0x1123B, 0x1123C), (0x112A9, 0x112A9),
    (0x1144B, 0x1144C), (0x115C2, 0x115C3), (0x115C9, 0x115D7), (0x11641, 0x11642),
    (0x1173C, 0x1173E), (0x11944, 0x11944), (0x11946, 0x11946), (0x11A42, 0x11A43),
    (0x11A9B, 0x11A9C), (0x11C41, 0x11C42), (0x11EF7, 0x11EF8), (0x11F43, 0x11F44),
    (0x16A6E, 0x16A6F), (0x16AF5, 0x16AF5), (0x16B37, 0x16B38), (0x16B44, 0x16B44),
    (0x16E98, 0x16E98), (0x1BC9F, 0x1BC9F), (0x1DA88, 0x1DA88),
)  # fmt: skip

TERMINAL_PUNCTUATION: frozenset[str] = frozenset(
    chr(c) for lo, hi in _TERMINAL_RANGES for c in range(lo, hi + 1)
)
"""Characters that end a sentence (FineWeb's line-punctuation rule)."""

_VISIBLE_PUNCTUATION = (
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
)
_CONTROL = "".join(
    chr(c) for lo, hi in ((0, 9), (11, 13), (13, 32), (127, 160)) for c in range(lo, hi)
)
PUNCTUATION: frozenset[str] = frozenset(_VISIBLE_PUNCTUATION + _CONTROL) | TERMINAL_PUNCTUATION
"""Characters that do not make a word (Gopher's symbol words are made of these only)."""

# ------------------------------------------------------------------ words


def _tokens(spaced: str) -> frozenset[str]:
    return frozenset(spaced.split())


_PUNCT = "…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪"
_QUOTES = "'\"”“`‘´’‚„»«「」『』（）〔〕【】《》〈〉"
_PREFIX = frozenset(_PUNCT + _QUOTES + "§%=—–+$£€¥฿₹₽₩")
_SUFFIX = frozenset(_PUNCT + _QUOTES + "—–")
_CLITICS = ("'s", "'S", "’s", "’S", "'re", "'ve", "'ll", "'d", "'m", "’re", "’ve", "’ll", "’d",
            "’m")  # fmt: skip
_KEEP = _tokens(
    "Mr. Mrs. Ms. Dr. St. Jr. Sr. Inc. Ltd. Co. co. vs. Corp. Jan. Feb. Mar. Apr. Jun. Jul. "
    "Aug. Sep. Sept. Oct. Nov. Dec. Mt. Prof. Gen. Gov. Sen. Rep. Rev. e.g. i.e. a.m. p.m. "
    "Ph.D. Calif. Mass. Ga. Fla. Ill. Wash. Ore. Va. and/or o'clock ma'am 'cause 'em ya'll "
    "xD <3 o.O O.O 's 'S ’s 're 've 'll 'd 'm n't"
)
"""Whole tokens, never split (spaCy's English special cases that occur in text)."""
_EMOTICONS = _tokens(
    "): :) :( (: :] [: =] ]= :p :P :D =D =) (= =( [= :/ :'( :') 8) (8 ;) ;-) :-) :-( (-: )-: "
    ":-/ :-] :-P :-p :-D ''"
)
"""Special cases made of punctuation: spaCy joins them back after splitting affixes."""
_EMOTICON_CHARS = frozenset(":;=()[]'")
"""Every emoticon holds one of these: a chunk without any has none to join back."""
assert all(not _EMOTICON_CHARS.isdisjoint(e) for e in _EMOTICONS)
_EMOTICON_IN = re.compile("|".join(map(re.escape, sorted(_EMOTICONS))))
"""Finds an emoticon inside a chunk: the pieces of a chunk spell it, so only a chunk holding
one can have pieces to join back."""
_NT_BASES = "do does did is are was were has have had could would should ca wo must need"
_SPLIT: dict[str, tuple[str, ...]] = {
    **{b + "nt": (b, "nt") for b in _NT_BASES.split()},
    "cannot": ("can", "not"), "im": ("i", "m"), "id": ("i", "d"), "wed": ("we", "d"),
    "ive": ("i", "ve"), "youre": ("you", "re"), "theyre": ("they", "re"), "hes": ("he", "s"),
    "shes": ("she", "s"), "whats": ("what", "s"), "thats": ("that", "s"),
    "gonna": ("gon", "na"), "gotta": ("got", "ta"), "y'all": ("y'", "all"),
}  # fmt: skip
_SPLIT.update({k.capitalize(): (v[0].capitalize(), *v[1:]) for k, v in list(_SPLIT.items())})
_SPLIT.update({"Im": ("I", "m"), "Id": ("I", "d"), "Ive": ("I", "ve")})
"""Contractions written without an apostrophe, split as spaCy's special cases split them."""
_INITIALS = re.compile(r"(?:[^\W\d_]\.)+\Z")
_HOST = re.compile(r"[\w-]+(?:\.[\w-]+)*\.[a-z]{2,63}(?:/\S*)?\Z")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+\Z")
_INFIX = re.compile(
    r"\.{2,}|…"
    r"|(?<=[0-9])[+\-*^](?=[0-9-])"
    r"|(?<=[^\W_])(?:---|--|-|–|—|~)(?=[^\W\d_])"
    r"|(?<=[^\W_])[:<>=/](?=[^\W\d_])"
    r"|(?<=[^\W\d_]),(?=[^\W\d_])"
    r"|(?<=[a-z'\"])\.(?=[A-Z'\"])"
)
_INFIX_SPLIT = re.compile(f"(?=[.…+\\-*^–—~:<>=/,])({_INFIX.pattern})")
"""`_INFIX` as a group, for `re.split`, behind a lookahead for the characters an infix starts
with (every alternative's first): the same matches, tried only where one can begin."""


def _is_special(chunk: str) -> bool:
    """An abbreviation, initials or an emoticon: one token, affixes included."""
    return (
        chunk in _KEEP
        or chunk in _EMOTICONS
        or (chunk[-1] == "." and _INITIALS.match(chunk) is not None)
    )


def _is_url(chunk: str) -> bool:
    """A URL, host or file name with a domain-like suffix, or an e-mail address (after its
    affixes are removed): one token, no infix splitting."""
    if "://" in chunk or chunk.startswith("www."):
        return True
    if "@" in chunk:
        return _EMAIL.match(chunk) is not None
    return "." in chunk and _HOST.match(chunk) is not None


def _period_splits(chunk: str) -> bool:
    """A final period is a suffix after a digit, a lower-case letter, punctuation or a quote,
    or two capitals; not after one capital (initials)."""
    before = chunk[-2]
    if before.isdigit() or before.islower() or before in _SUFFIX or before in "%":
        return True
    return len(chunk) > 2 and before.isupper() and chunk[-3].isupper()


def _strip_suffixes(chunk: str, tail: list[str]) -> str:
    """Remove suffix punctuation, ellipses and clitics from the end (kept in `tail`,
    innermost last)."""
    while len(chunk) > 1 and not _is_special(chunk) and chunk not in _SPLIT:
        last = chunk[-1]
        if chunk.endswith("..."):
            cut = len(chunk.rstrip("."))
        elif (
            last in _SUFFIX
            or (last == "." and _period_splits(chunk))
            or (last in "%+" and chunk[-2].isdigit())
        ):
            cut = len(chunk) - 1
        elif len(chunk) > 3 and chunk[-3:] in ("n't", "n’t", "N'T"):
            cut = len(chunk) - 3
        elif "'" not in chunk[-4:] and "’" not in chunk[-4:]:
            return chunk  # no clitic ends it (each holds an apostrophe in its last 4)
        else:
            clitic = next((c for c in _CLITICS if chunk.endswith(c)), None)
            if clitic is None or len(clitic) == len(chunk):
                return chunk
            cut = len(chunk) - len(clitic)
        if cut == 0:
            return chunk
        tail.append(chunk[cut:])
        chunk = chunk[:cut]
    return chunk


def _split_chunk(chunk: str) -> list[str]:
    """The tokens of one whitespace-free chunk."""
    out = _split_simple(chunk)
    if out is None:
        out = []
        _split_general(chunk, out)
    if len(out) > 1 and not _EMOTICON_CHARS.isdisjoint(chunk) and _EMOTICON_IN.search(chunk):
        _join_emoticons(out, 0)
    return out


def _join_emoticons(out: list[str], start: int) -> None:
    """Join adjacent pieces of one chunk that spell an emoticon (`)` `:` -> `):`)."""
    i = start
    while i < len(out) - 1:
        for n in (3, 2):
            if i + n <= len(out) and "".join(out[i : i + n]) in _EMOTICONS:
                out[i : i + n] = ["".join(out[i : i + n])]
                break
        i += 1


_PREFIX_CHARS = "".join(sorted(_PREFIX - {"+"}))
_SUFFIX_CHARS = "".join(sorted(_SUFFIX))
_WHOLE = _KEEP | _EMOTICONS
_UNSPLIT = _WHOLE | frozenset(_SPLIT)
_APOSTROPHES = frozenset("'’")
assert not any(c.isalnum() or c == "." for c in _PREFIX | _SUFFIX)


def _split_simple(chunk: str) -> list[str] | None:
    """`_split_general` for the common chunk: prefix punctuation, a word with alphanumeric
    ends and no apostrophe, suffix punctuation, maybe a final period (`(word),` `#word`
    `word.` `self-made` `3.14`); None for any other chunk.

    The general loops peel these affixes one character at a time: each prefix character while
    the rest is no special case (a `+` is left to them), then a final period when
    `_period_splits` says so, then each suffix character while the rest is no special case and
    no contraction. The word then meets no suffix or clitic rule (they look at its last
    characters and apostrophes), so it ends as `_SPLIT`'s pieces, whole (a special case or a
    URL) or split at its infixes. Where a special case would stop a loop, None.
    """
    period = chunk[-1] == "."
    body = chunk[:-1] if period else chunk
    rest = body.lstrip(_PREFIX_CHARS)
    word = rest.rstrip(_SUFFIX_CHARS)
    alnum = word.isalnum()
    if not alnum and not (
        word and word[0].isalnum() and word[-1].isalnum() and _APOSTROPHES.isdisjoint(word)
    ):
        return None
    num_head = len(body) - len(rest)
    if num_head:
        for k in range(num_head):
            if chunk[k:] in _WHOLE:
                return None
        out = list(body[:num_head])
    else:
        out = []
    if period:
        whole = rest + "."
        if whole in _SPLIT or _is_special(whole):
            return None
        if not _period_splits(whole):  # then `rest` is `word`: a suffix before would split
            _split_word(whole, alnum, out)
            return out
    num_word = len(word)
    if len(rest) > num_word:
        for j in range(len(rest), num_word, -1):  # `word` and its suffixes but the last j
            if rest[:j] in _UNSPLIT:
                return None
    pieces = _SPLIT.get(word)
    if pieces is not None:
        out.extend(pieces)
    elif alnum:
        out.append(word)
    else:
        _split_word(word, False, out)
    if len(rest) > num_word:
        out.extend(rest[num_word:])
    if period:
        out.append(".")
    return out


def _split_word(word: str, plain: bool, out: list[str]) -> None:
    """A word left by the affix rules: whole when `plain` (alphanumeric, or that and a final
    period: no infix can match), a special case or a URL, else split at its infixes."""
    if plain or word in _WHOLE or _is_url(word):
        out.append(word)
    else:
        _split_infixes(word, out)


def _split_general(chunk: str, out: list[str]) -> None:
    """Peel prefixes, suffixes and clitics; split infixes (spaCy's tokenizer loop)."""
    while len(chunk) > 1 and chunk[0] in _PREFIX and not _is_special(chunk):
        if chunk[0] == "+" and chunk[1].isdigit():
            break
        out.append(chunk[0])
        chunk = chunk[1:]
    if chunk.startswith("...") and len(chunk) > 3 and chunk.strip("."):
        dots = len(chunk) - len(chunk.lstrip("."))
        out.append(chunk[:dots])
        chunk = chunk[dots:]
    tail: list[str] = []
    chunk = _strip_suffixes(chunk, tail)
    if chunk in _SPLIT:
        out.extend(_SPLIT[chunk])
    elif len(chunk) == 1 or _is_special(chunk) or _is_url(chunk):
        out.append(chunk)
    else:
        _split_infixes(chunk, out)
    out.extend(reversed(tail))


def _split_infixes(chunk: str, out: list[str]) -> None:
    parts = _INFIX_SPLIT.split(chunk)
    if len(parts) == 1:
        out.append(chunk)
    else:  # the infixes (never empty) and the non-empty pieces between them, in order
        out.extend(filter(None, parts))


_MEMO: dict[str, tuple[str, ...]] = {}
"""Pieces of chunks already split (punctuated words recur Zipf-fashion across a corpus)."""
_MEMO_MAX = 200_000
"""Entries kept before the memo is emptied: bounds its memory (tens of MB) on any corpus."""


def _pieces(chunk: str) -> tuple[str, ...]:
    """`chunk` split into its tokens, and memoised (the split depends on the chunk alone)."""
    got = tuple(_split_chunk(chunk))
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[chunk] = got
    return got


def split_words(text: str) -> list[str]:
    """The words of `text` (punctuation tokens included), about as spaCy's English tokeniser
    splits them: see the module docstring."""
    out: list[str] = []
    append, extend, memo = out.append, out.extend, _MEMO.get
    for chunk in text.split():
        if chunk.isalnum() and chunk not in _SPLIT:
            append(chunk)
        else:
            extend(memo(chunk) or _pieces(chunk))
    return out


# ------------------------------------------------------------------ sentences


def is_punct(word: str) -> bool:
    """Every character is Unicode punctuation (spaCy's `is_punct`)."""
    return all(unicodedata.category(c).startswith("P") for c in word)


def count_sentences(words: list[str]) -> int:
    """Sentences among `words` (of one line) by spaCy's rule-based sentencizer: a sentence
    starts at the first word and at each word that follows a sentence-final character (one
    of `TERMINAL_PUNCTUATION`, as a word of its own) and is neither punctuation nor final."""
    count, seen_end = (1 if words else 0), False
    for w in words:
        is_end = w in TERMINAL_PUNCTUATION
        if seen_end and not is_end and not is_punct(w):
            count += 1
            seen_end = False
        elif is_end:
            seen_end = True
    return count
