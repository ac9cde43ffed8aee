"""Calibration and held-out evaluation tokens from the user's own data: a Megatron indexed
dataset, or plain JSONL (one {"text": ...} per line) or text tokenized with the model's own
tokenizer (so a third-party model is scored on the tokens it was trained to read).

Why these slices: Megatron splits an indexed dataset by document order ("98,2,0" puts the last
2% of documents in validation), so the tail of the token stream is the data the model saw least
(or never). llmctl takes calibration sequences from the head of the stream and held-out
evaluation tokens from the tail, never overlapping, and reads both through a memory map: memory
does not grow with the corpus. Every id is checked against the tokenizer and the model's
embedding rows before any model is loaded, because an id out of range would otherwise surface as
an index error deep inside a forward pass (or, worse, silently score a different tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmctl.data.indexed import bin_path, idx_path, read_header
from llmctl.data.readers import COMPRESSED_SUFFIXES, JSONL_SUFFIXES
from llmctl.errors import UserError


@dataclass(frozen=True, slots=True)
class TokenSplit:
    """Calibration sequences and held-out tokens, as int64 arrays."""

    calibration: np.ndarray  # [num_samples, seq_len]
    heldout: np.ndarray  # [num_eval_tokens]
    total_tokens: int


def open_tokens(prefix: str | Path) -> np.ndarray:
    """The whole token stream of a dataset as a read-only memory map.

    Raises:
        UserError: Missing files or not a Megatron index.
    """
    for path in (bin_path(prefix), idx_path(prefix)):
        if not path.is_file():
            raise UserError(f"calibration data {prefix}: {path} not found")
    try:
        dtype = read_header(prefix).dtype
    except ValueError as e:
        raise UserError(f"calibration data {prefix}: {e}") from e
    if bin_path(prefix).stat().st_size == 0:  # np.memmap cannot map an empty file
        raise UserError(_no_tokens(prefix, "an empty indexed dataset"))
    return np.memmap(bin_path(prefix), dtype=dtype, mode="r")


TEXT_SUFFIXES = (*JSONL_SUFFIXES, ".txt", ".text", ".md")


def _kind_suffix(path: str | Path) -> str:
    """The suffix naming the format, under a `.gz`/`.zst` one (`a.jsonl.gz` -> `.jsonl`)."""
    p = Path(path)
    if p.suffix.lower() in COMPRESSED_SUFFIXES:
        p = p.with_suffix("")
    return p.suffix.lower()


def is_text_data(data: str | Path) -> bool:
    """A JSONL or text file (by suffix, possibly `.gz`/`.zst`), not an indexed-dataset prefix."""
    return _kind_suffix(data) in TEXT_SUFFIXES


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: invalid UTF-8 (byte {e.start})") from None


def _read_documents(path: Path) -> list[str]:
    """Documents of a JSONL file (its "text" fields) or of a text file (the whole file),
    decompressed like `llmctl data preprocess` inputs and decoded strictly as UTF-8.

    Raises:
        UserError: Invalid UTF-8, a JSONL line that is not an object with a string "text", or
            a compressed file cut short, naming the file (and line).
    """
    from llmctl.data.readers import TruncatedError, compressed_lines, decompressed_blocks

    compressed = path.suffix.lower() in COMPRESSED_SUFFIXES
    try:
        if _kind_suffix(path) not in JSONL_SUFFIXES:
            raw = b"".join(decompressed_blocks(path)) if compressed else path.read_bytes()
            return [_decode(raw, str(path))]
        if not compressed:
            with path.open("rb") as f:
                return list(_jsonl_texts(f, path))
        return list(_jsonl_texts(compressed_lines(path), path))
    except TruncatedError as e:
        raise UserError(f"{path}: truncated archive ({e})") from None


def _jsonl_texts(lines: Iterable[bytes], path: Path) -> Iterator[str]:
    for lineno, raw in enumerate(lines, 1):
        line = _decode(raw, f"{path}:{lineno}")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
        text = obj.get("text") if isinstance(obj, dict) else None
        if not isinstance(text, str):
            raise UserError(f'{path}:{lineno}: expected a JSON object with a string "text"')
        yield text


def text_tokens(path: str | Path, tokenizer: str | Path) -> np.ndarray:
    """Tokenize a JSONL or text file with a model's tokenizer: documents joined by its EOD.

    Raises:
        UserError: The file or tokenizer is missing or malformed.
    """
    from llmctl.data.tokenizer import Tokenizer, resolve_tokenizer

    p = Path(path)
    if not p.is_file():
        raise UserError(f"data {path} not found")
    tok = Tokenizer(resolve_tokenizer(tokenizer))
    encoded = tok.encode_batch(_read_documents(p))
    if not any(len(doc) for doc in encoded):
        raise UserError(_no_tokens(path, "an empty file or only empty documents"))
    ids = [t for doc in encoded for t in (*doc, tok.eod)]
    return np.asarray(ids, dtype=np.int64)


def _no_tokens(data: str | Path, why: str) -> str:
    return f"data {data} has no tokens ({why}); pass --data with text to calibrate on"


def _prefix_of(data: str | Path) -> str:
    """The indexed-dataset prefix meant by `data`: `d.bin` or `d.idx` mean `d`.

    Raises:
        UserError: `data` is a folder.
    """
    p = Path(data)
    if p.is_dir():
        raise UserError(
            f"calibration data {data} is a folder; pass an indexed dataset prefix (PREFIX for "
            "PREFIX.bin/.idx) or a .jsonl/.txt file"
        )
    if p.suffix in (".bin", ".idx") and not bin_path(p).is_file():
        return str(p.with_suffix(""))
    return str(data)


def load_tokens(data: str | Path, tokenizer: str | Path | None) -> np.ndarray:
    """Token stream of `data`: an indexed prefix (already tokenized) or a JSONL/text file
    (tokenized here with `tokenizer`, the model's own).

    Raises:
        UserError: missing or malformed data, or data without a single token.
    """
    if not is_text_data(data):
        return open_tokens(_prefix_of(data))
    if tokenizer is None:
        raise UserError(f"data {data} is text and the model has no tokenizer; pass --tokenizer")
    return text_tokens(data, tokenizer)


def _too_short(total: int, num_samples: int, seq_len: int, num_eval_tokens: int) -> str:
    if not num_samples:  # RTN/FP8: no calibration, only the held-out tokens are needed
        return (
            f"data has {total} tokens but {num_eval_tokens} held-out tokens are needed "
            "(this scheme and algorithm need no calibration); lower --eval-tokens"
        )
    need = num_samples * seq_len + num_eval_tokens
    return (
        f"calibration data has {total} tokens but {num_samples} samples x {seq_len} tokens "
        f"+ {num_eval_tokens} held-out tokens = {need} are needed; "
        "lower --num-samples, --seq-len or --eval-tokens"
    )


def split_tokens(
    tokens: np.ndarray, num_samples: int, seq_len: int, num_eval_tokens: int
) -> TokenSplit:
    """Calibration from the head, evaluation from the tail, no overlap.

    Raises:
        UserError: If the stream is too short for both, naming what to lower.
    """
    need_cal, total = num_samples * seq_len, int(tokens.shape[0])
    if need_cal + num_eval_tokens > total:
        raise UserError(_too_short(total, num_samples, seq_len, num_eval_tokens))
    calibration = np.asarray(tokens[:need_cal], dtype=np.int64).reshape(num_samples, seq_len)
    heldout = np.asarray(tokens[total - num_eval_tokens :], dtype=np.int64)
    return TokenSplit(calibration, heldout, total)


def check_vocab(split: TokenSplit, tokenizer_vocab: int, model_vocab: int, source: str) -> None:
    """Every id must be a token of the tokenizer and a row of the model's embedding.

    Raises:
        UserError: Naming the largest id and both sizes.
    """
    largest = int(max(split.calibration.max(initial=0), split.heldout.max(initial=0)))
    limit = min(tokenizer_vocab, model_vocab)
    if largest >= limit:
        raise UserError(
            f"calibration data {source} has token id {largest} but the tokenizer has "
            f"{tokenizer_vocab} tokens and the model {model_vocab} embedding rows: the data was "
            "tokenized with a different tokenizer; re-run `llmctl data preprocess` with the "
            "model's tokenizer"
        )
