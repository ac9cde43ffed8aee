"""Language identification with py3langid (langid.py's model, 97 languages, in the wheel).

Why py3langid: its model ships inside the PyPI package (no download at run time), it needs
numpy only, and it is a maintained fork of langid.py (Lui and Baldwin 2012, ACL demo track)
that its author measured 3-10x faster than the original. fastText's lid.176 is not shipped
in a maintained package on PyPI, and lingua's high-accuracy mode is far slower per document.
Measured here (benchmarks/data_clean.py --langid, docs/data.md): accuracy per language on
the gettext-catalogue sample of `clean_corpus`, and documents per second.

Scores are probabilities (`norm_probs=True`: softmax of the naive-Bayes scores scaled by the
square root of the byte length, py3langid's calibration). Only the first `max_chars`
characters are classified, which bounds the cost of long documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from llmctl.errors import UserError


@lru_cache(maxsize=1)
def identifier() -> Any:
    """py3langid's identifier with normalised probabilities (loaded once per process).

    Raises:
        UserError: py3langid is not installed.
    """
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise UserError("language filtering needs py3langid: pip install 'llmctl[data]'") from None
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@dataclass(kw_only=True)
class LanguageConfig:
    """Keep documents in some languages, identified with at least some probability."""

    languages: list[str] = field(default_factory=list)
    """ISO 639-1 codes to keep (py3langid's labels, e.g. en, de, zh); empty keeps all."""
    min_score: float = 0.65
    """Lowest probability of the identified language to keep a document (FineWeb: 0.65)."""
    max_chars: int = 10_000
    """Classify only the first this many characters."""

    def classify(self, text: str) -> tuple[str, float]:
        """(language, probability) of `text`."""
        lang, score = identifier().classify(text[: self.max_chars])
        return str(lang), float(score)

    def check(self, text: str) -> tuple[str | None, str, float]:
        """(reason to reject or None, language, probability)."""
        lang, score = self.classify(text)
        if self.languages and lang not in self.languages:
            return f"language_{lang}", lang, score
        if score < self.min_score:
            return "language_low_score", lang, score
        return None, lang, score
