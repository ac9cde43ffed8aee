"""Decontamination: documents sharing a word n-gram (13 by default) with an evaluation set.

GPT-3's contamination analysis (Brown et al. 2020, appendix C) flags training documents that
share a 13-gram with a benchmark. Words here are lower-cased runs of letters and digits
(punctuation and spacing ignored), so formatting differences do not hide an overlap. The
evaluation n-grams are held as 64-bit hashes (xxh3 when installed, else blake2b), one set for
all evaluation files; a document is contaminated when any of its n-grams is in the set.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

_WORD = re.compile(r"[^\W_]+")


class DecontamAction(StrEnum):
    """What to do with a contaminated document."""

    DROP = "drop"
    FLAG = "flag"


def _hasher() -> Any:
    try:
        import xxhash

        return lambda s: xxhash.xxh3_64_intdigest(s.encode("utf-8"))
    except ImportError:  # pragma: no cover - xxhash is in the data extra
        return lambda s: int.from_bytes(
            hashlib.blake2b(s.encode(), digest_size=8).digest(), "little"
        )


_HASH = _hasher()


def ngram_hashes(text: str, n: int) -> Iterator[int]:
    """Hashes of the word n-grams of `text` (a text shorter than n words gives its whole
    word sequence once, so short evaluation items still count)."""
    words = _WORD.findall(text.lower())
    if len(words) < n:
        if words:
            yield _HASH(" ".join(words))
        return
    for i in range(len(words) - n + 1):
        yield _HASH(" ".join(words[i : i + n]))


def _eval_texts(path: Path) -> Iterator[str]:
    """Every string of every record (JSONL) or every non-empty line (text) of an eval file."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.suffix.lower() not in (".jsonl", ".json", ".ndjson"):
                yield line
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{number}: invalid JSON ({e.msg})") from None
            yield from _strings(record)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@dataclass(kw_only=True)
class DecontamConfig:
    """Evaluation sets to decontaminate against, and how."""

    eval_files: list[str] = field(default_factory=list)
    """Local JSONL (every string field) or text (every line) files of evaluation items."""
    ngram: int = 13
    """Words per n-gram (GPT-3's analysis used 13)."""
    action: DecontamAction = DecontamAction.DROP
    """drop the document, or flag it (kept, with a `contamination` field)."""

    def load(self) -> frozenset[int]:
        """The n-gram hashes of every evaluation item.

        Raises:
            UserError: an evaluation file is missing or not valid JSONL.
        """
        if self.ngram < 1:
            raise UserError(f"decontam.ngram must be >= 1, got {self.ngram}")
        hashes: set[int] = set()
        for name in self.eval_files:
            path = Path(name)
            if not path.is_file():
                raise UserError(f"evaluation file {path} does not exist")
            for text in _eval_texts(path):
                hashes.update(ngram_hashes(text, self.ngram))
        return frozenset(hashes)


def contaminated(text: str, ngram: int, hashes: frozenset[int]) -> bool:
    """Whether `text` shares an n-gram with the evaluation sets."""
    return any(h in hashes for h in ngram_hashes(text, ngram))
