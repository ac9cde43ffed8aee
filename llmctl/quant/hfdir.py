"""Read a Hugging Face model directory without loading it: config, tensor shapes, sizes.

Pure Python (stdlib only). A safetensors file starts with an 8-byte little-endian header length
and a JSON header mapping each tensor name to its dtype, shape and byte range, so every check
that runs before the heavy work (architecture, Linear shapes for group-size divisibility,
vocabulary size, bits per weight of an output) reads only those headers.
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
# Parts of a parameter name that mark a 2-D weight as something other than a Linear.
_NOT_LINEAR = ("embed", "norm", "wte", "wpe")


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


def linear_shapes(tensors: dict[str, TensorInfo]) -> dict[str, tuple[int, int]]:
    """Module name -> (out_features, in_features) of every Linear weight in a dense checkpoint.

    A Linear is a 2-D `<module>.weight` that is not an embedding, a norm or a MoE router
    (transformers' routers are not `nn.Linear`, so compressed-tensors never quantizes them).
    """
    out = {}
    for name, info in tensors.items():
        if not name.endswith(".weight") or len(info.shape) != 2:
            continue
        module = name[: -len(".weight")]
        if any(part in module for part in _NOT_LINEAR) or module.endswith(".gate"):
            continue  # embeddings, norms, MoE routers (`block_sparse_moe.gate`)
        out[module] = (int(info.shape[0]), int(info.shape[1]))
    return out


def dir_size_bytes(path: Path) -> int:
    """Bytes of the weight files (`*.safetensors`) of a model directory."""
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def has_tokenizer(model_dir: Path) -> bool:
    """Whether the directory carries a `tokenizer.json` or a SentencePiece model."""
    return (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer.model").is_file()


def tokenizer_vocab_size(model_dir: Path) -> int:
    """Vocabulary size (with added tokens) of the directory's `tokenizer.json`."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{model_dir} has no tokenizer.json (needed to check calibration data)")
    return int(Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True))


_AUX_SUFFIXES = ("weight_scale", "weight_zero_point", "weight_global_scale")


def quantized_bits_per_weight(
    tensors: dict[str, TensorInfo], packed_num_bits: int = 4
) -> tuple[float, int]:
    """Achieved bits per weight over the compressed Linears of a compressed-tensors checkpoint.

    Counts the stored weight (`weight_packed`, `packed_num_bits` values per int32, or the 8-bit
    `weight`) plus its scales and zero points, divided by the number of original weights.
    `weight_shape` (two int64 values of metadata) and `weight_g_idx` (activation-order
    permutation, absent for the static order llmctl uses) are not weight storage.

    Returns:
        (bits per weight, number of quantized Linears).
    """
    total_bits = total_weights = count = 0
    for name in tensors:
        if not name.endswith(".weight_scale"):
            continue
        module = name[: -len(".weight_scale")]
        packed = tensors.get(f"{module}.weight_packed")
        stored = packed if packed is not None else tensors.get(f"{module}.weight")
        if stored is None:
            continue
        num_weights = 1
        for d in stored.shape:
            num_weights *= d
        if packed is not None:
            num_weights *= 32 // packed_num_bits
        aux = sum(
            tensors[f"{module}.{s}"].num_bytes for s in _AUX_SUFFIXES if f"{module}.{s}" in tensors
        )
        total_bits += (stored.num_bytes + aux) * 8
        total_weights += num_weights
        count += 1
    return (total_bits / total_weights if total_weights else 0.0), count
