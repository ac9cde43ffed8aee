"""Closed vocabularies of the `llmctl data` options, importable without numpy (the CLI shows
them as choices in `--help`)."""

from __future__ import annotations

from enum import StrEnum


class DedupMode(StrEnum):
    """Which duplicates to remove."""

    EXACT = "exact"
    FUZZY = "fuzzy"
    BOTH = "both"


class Verify(StrEnum):
    """How LSH candidate pairs are checked before they are merged."""

    NONE = "none"
    SIGNATURE = "signature"
    EXACT = "exact"


class Unit(StrEnum):
    """What shingles are made of (the values of `minhash.ShingleUnit`)."""

    WORD = "word"
    CHAR = "char"


class Launcher(StrEnum):
    """Where a data command runs."""

    LOCAL = "local"
    SLURM = "slurm"


class TokenizerKind(StrEnum):
    """Tokenizer file formats llmctl reads."""

    HF = "hf"
    SENTENCEPIECE = "sentencepiece"
    TIKTOKEN = "tiktoken"
