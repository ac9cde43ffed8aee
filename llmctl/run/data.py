"""Training data checks before any process starts (no torch): `resolve_data` checks that every
`.bin/.idx` prefix is readable, builds or finds the demo corpus when no prefix is given, and
checks the tokenizer's vocabulary against the model's (from `data.tokenizer`, else from the
`<prefix>.manifest.json` that `llmctl data preprocess` writes). The datasets themselves are
built on the ranks by `llmctl.train.data`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eos|>", "<eod>", "<|end_of_text|>")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """Checked inputs of the data pipeline."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None
    tokenizer_path: str | None
    tokenizer_vocab_size: int | None
    eod_id: int
    cache_dir: str
    sft: bool = False
    """The prefixes are packed SFT datasets (`llmctl data sft`)."""
    pairs: bool = False
    """The prefixes are packed DPO pairs (`llmctl data prefs`; `sft` is true too)."""


def default_cache_dir(cfg: RootConfig) -> Path:
    """`data.cache_dir`, or ~/.cache/llmctl/demo."""
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir).expanduser()
    return Path.home() / ".cache" / "llmctl" / "demo"


def check_prefix(prefix: str) -> None:
    """Raise `UserError` unless `prefix.bin` and `prefix.idx` exist and are readable."""
    for ext in (".bin", ".idx"):
        path = Path(prefix + ext)
        if not path.is_file():
            raise UserError(
                f"data prefix {prefix}: {path} not found; build it with `llmctl data preprocess`"
            )
        if not os.access(path, os.R_OK):
            raise UserError(f"data prefix {prefix}: {path} is not readable (check permissions)")


def num_documents(prefix: str) -> int:
    """Documents in an indexed dataset, read from the `.idx` header (magic, version, dtype,
    sequence count, document count) without mapping the file."""
    with open(prefix + ".idx", "rb") as f:
        header = f.read(34)
    if len(header) < 34 or not header.startswith(b"MMIDIDX"):
        raise UserError(f"data prefix {prefix}: {prefix}.idx is not a Megatron index file")
    # the document index starts with a 0 bookend, so it holds documents + 1 entries
    return int.from_bytes(header[26:34], "little") - 1


def check_split(prefix: str, split: str) -> None:
    """Refuse a split that leaves the train or validation part without documents.

    megatron-core's GPTDataset never returns when asked for samples from an empty split, so
    this is checked up front with the same rounding megatron uses for the split bookends.
    """
    try:
        parts = [float(x) for x in split.replace("/", ",").split(",")]
    except ValueError:
        raise UserError(f"data.split={split!r}: expected numbers like '98,2,0'") from None
    parts = [*parts, 0.0, 0.0, 0.0][:3]
    if sum(parts) <= 0 or min(parts) < 0:
        raise UserError(f"data.split={split!r}: parts must be >= 0 with a positive sum")
    n = num_documents(prefix)
    bookends = [0]
    for part in parts:
        bookends.append(bookends[-1] + round(part / sum(parts) * n))
    for name, i in (("train", 0), ("validation", 1)):
        if bookends[i + 1] - bookends[i] < 1:
            raise UserError(
                f"data prefix {prefix}: {n} documents leave the {name} split of "
                f"data.split={split} empty; use more documents or change data.split"
            )


def tokenizer_info(path: str) -> tuple[int, int]:
    """(vocab size including added tokens, end-of-document id) of a `tokenizer.json`.

    Raises:
        UserError: If the file is missing or not a tokenizers JSON file.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"data.tokenizer={path} not found (expected a tokenizer.json)")
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(p))
    except Exception as e:
        raise UserError(f"data.tokenizer={path} is not a readable tokenizer.json: {e}") from e
    eod = next((i for t in EOD_CANDIDATES if (i := tok.token_to_id(t)) is not None), 0)
    return tok.get_vocab_size(with_added_tokens=True), eod


def _demo_data(cfg: RootConfig) -> str:
    """Build (or reuse) the demo corpus under the cache directory; returns its prefix."""
    from llmctl.data.demo import prepare_demo_data

    return str(prepare_demo_data(default_cache_dir(cfg)))


def manifest_tokenizer(prefix: str) -> dict[str, Any] | None:
    """The tokenizer record `llmctl data preprocess` left in `<prefix>.manifest.json`, if any."""
    path = Path(prefix + ".manifest.json")
    if not path.is_file():
        return None
    try:
        tok = json.loads(path.read_text()).get("tokenizer")
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not readable JSON ({e}); rerun `llmctl data preprocess`") from e
    return tok if isinstance(tok, dict) else None


def _tokenizer_facts(
    prefixes: list[str], tok_path: str | None
) -> tuple[str | None, int | None, int]:
    """(tokenizer path, vocab size, EOD id) from data.tokenizer or the datasets' manifests."""
    if tok_path:
        vocab, eod = tokenizer_info(tok_path)
        return tok_path, vocab, eod
    records = [(p, t) for p in prefixes if (t := manifest_tokenizer(p)) is not None]
    digests = {t.get("sha256") for _, t in records}
    if len(digests) > 1:
        names = ", ".join(p for p, _ in records)
        raise UserError(f"data.prefixes were tokenized with different tokenizers: {names}")
    if not records:
        return None, None, 0
    tok = records[0][1]
    return tok.get("path"), int(tok["vocab_size"]), int(tok.get("eod", 0))


def resolve_data(cfg: RootConfig) -> DataSpec:
    """Check the data config and return what the ranks need. Runs before processes start.

    Raises:
        UserError: Missing/unreadable prefix, weight count mismatch, or a tokenizer whose
            vocabulary is larger than `model.vocab_size`.
    """
    check_sft_wanted(cfg)
    prefixes = list(cfg.data.prefixes) or [_demo_data(cfg)]
    for prefix in prefixes:
        check_prefix(prefix)
        check_split(prefix, cfg.data.split)
    weights = cfg.data.weights
    if weights is not None and len(weights) != len(prefixes):
        raise UserError(
            f"data.weights has {len(weights)} entries but data.prefixes has {len(prefixes)}"
        )
    sft = _check_sft(cfg, prefixes)
    from llmctl.run.dpo import check_pairs

    pairs = check_pairs(cfg, prefixes)  # train.objective=dpo <=> `llmctl data prefs` packs
    tok_path, vocab, eod = _tokenizer_facts(prefixes, cfg.data.tokenizer)
    if vocab is not None and vocab > cfg.model.vocab_size:
        raise UserError(
            f"tokenizer {tok_path} has {vocab} tokens but model.vocab_size="
            f"{cfg.model.vocab_size}; set model.vocab_size >= {vocab} or retokenize"
        )
    return DataSpec(
        prefixes=tuple(prefixes),
        weights=None if weights is None else tuple(float(w) for w in weights),
        tokenizer_path=tok_path,
        tokenizer_vocab_size=vocab,
        eod_id=eod,
        cache_dir=str(default_cache_dir(cfg)),
        sft=sft,
        pairs=pairs,
    )


def check_sft_wanted(cfg: RootConfig) -> None:
    """`data.sft=true` (recipe tiny_cpu_sft) needs explicit data.prefixes: the demo corpus is
    pretraining text, on which SFT would silently train every token.

    Raises:
        UserError: data.sft=true with empty data.prefixes.
    """
    if cfg.data.sft is True and not cfg.data.prefixes:
        raise UserError(
            "data.sft=true needs data.prefixes: SFT packs from `llmctl data sft` (the demo "
            "corpus is pretraining data); or pass data.sft=null to train on every token"
        )


def _check_sft(cfg: RootConfig, prefixes: list[str]) -> bool:
    """Whether the prefixes are SFT packs; checks them against `data.sft`, their companions
    and their sequence length."""
    from llmctl.data.sft import output_prefixes, packed_seq_length

    seq = packed_seq_length(prefixes)
    wanted = cfg.data.sft
    if seq is None and wanted is True:
        raise UserError(
            f"data.sft=true but data prefix {prefixes[0]} is not an SFT pack (no sft-packed "
            "manifest): its loss would cover every token; make packs with `llmctl data sft`, "
            "or pass data.sft=null to train on every token"
        )
    if seq is not None and wanted is False:
        raise UserError(
            f"data.sft=false but data prefix {prefixes[0]} is an SFT pack (`llmctl data sft`); "
            "pass data.sft=true or data.sft=null to fine-tune on it"
        )
    if seq is None:
        return False
    if seq != cfg.model.seq_length:
        raise UserError(
            f"data.prefixes were packed for seq_length {seq} but model.seq_length="
            f"{cfg.model.seq_length}; set model.seq_length={seq} or rerun `llmctl data sft`"
        )
    if cfg.data.weights is not None:
        raise UserError("data.weights: SFT packs are concatenated, not blended; drop weights")
    for prefix in prefixes:
        for part in output_prefixes(prefix)[1:]:
            check_prefix(part)
    return True


def data_fingerprint(prefixes: tuple[str, ...]) -> str:
    """Digest of the `.idx` files, so indices cached for data rebuilt at the same path are not
    reused (megatron keys its index cache on the path and the config, not the content)."""
    digest = hashlib.sha256()
    for prefix in prefixes:
        with open(prefix + ".idx", "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
