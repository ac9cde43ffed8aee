"""Read a Hugging Face model directory without loading it: config, tensor shapes, sizes.

Pure Python (stdlib only; `tokenizer_vocab_size` imports `tokenizers`). A safetensors file
starts with an 8-byte little-endian header length and a JSON header mapping each tensor name to
its dtype, shape and byte range, so every check that runs before the heavy work (architecture,
Linear shapes for group-size divisibility, vocabulary size, bits per weight of an output) reads
only those headers.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

DTYPE_BITS: dict[str, int] = {
    "F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16,
    "I16": 16, "U16": 16, "I8": 8, "U8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "BOOL": 8,
}  # fmt: skip
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a safetensors file, from the header only."""

    dtype: str
    shape: tuple[int, ...]
    num_bytes: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor name -> info for one `.safetensors` file.

    Raises:
        UserError: If the file is not a safetensors file.
    """
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise UserError(f"{path} is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(size))
        except (ValueError, MemoryError) as e:
            raise UserError(f"{path} is not a safetensors file ({e})") from e
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        out[name] = TensorInfo(entry["dtype"], tuple(entry["shape"]), int(end - start))
    return out


def read_tensors(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of a model directory (all safetensors shards)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise UserError(f"{model_dir} holds no *.safetensors weights (pytorch .bin unsupported)")
    tensors: dict[str, TensorInfo] = {}
    for path in files:
        tensors.update(read_safetensors_header(path))
    return tensors


def read_config(model_dir: Path) -> dict[str, Any]:
    """`config.json` of a model directory.

    Raises:
        UserError: If it is missing or not JSON.
    """
    path = model_dir / "config.json"
    if not path.is_file():
        raise UserError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise UserError(f"{path} does not hold a JSON object")
    return data


def dir_size_bytes(path: Path) -> int:
    """Bytes of the weight files (`*.safetensors`) of a model directory."""
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def tokenizer_vocab_size(model_dir: Path) -> int:
    """Vocabulary size (with added tokens) of the directory's `tokenizer.json`."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{model_dir} has no tokenizer.json (needed to check calibration data)")
    return int(Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True))
