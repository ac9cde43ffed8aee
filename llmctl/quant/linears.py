"""The Linears a quantization touches, and what it stored, without loading a weight.

Shapes come from safetensors headers (`llmctl.hf.modeldir`) or, for a run directory that is
exported on the fly, from the model config (what `llmctl export hf` will write), so group-size
divisibility is checked before any heavy work. Bits per weight are measured on the
compressed-tensors output's headers. Stdlib only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmctl.hf.mapping import head_dim
from llmctl.hf.modeldir import TensorInfo

if TYPE_CHECKING:
    from llmctl.config.schema import ModelConfig

# Parts of a parameter name that mark a 2-D weight as something other than a Linear.
_NOT_LINEAR = ("embed", "norm", "wte", "wpe")
_AUX_SUFFIXES = ("weight_scale", "weight_zero_point", "weight_global_scale")


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


def hf_linear_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """Module name -> (out, in) of every Linear the export will contain (for pre-checks)."""
    h, d = model.hidden_size, head_dim(model)
    q, kv = model.num_attention_heads * d, model.num_query_groups * d
    shapes: dict[str, tuple[int, int]] = {}
    for i in range(model.num_layers):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.self_attn.q_proj": (q, h),
            f"{p}.self_attn.k_proj": (kv, h),
            f"{p}.self_attn.v_proj": (kv, h),
            f"{p}.self_attn.o_proj": (h, q),
        }
        shapes |= _mlp_linear_shapes(model, p)
    if not model.tied_embeddings:
        shapes["lm_head"] = (model.vocab_size, h)
    return shapes


def _mlp_linear_shapes(model: ModelConfig, prefix: str) -> dict[str, tuple[int, int]]:
    """The MLP Linears of one layer: gate/up/down, or each Mixtral expert's w1/w3/w2 (the
    router is not a Linear in transformers and is never quantized)."""
    h = model.hidden_size
    if not model.num_experts:
        f = model.ffn_hidden_size
        names = {"gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}
        return {f"{prefix}.mlp.{n}": shape for n, shape in names.items()}
    f = model.moe_ffn_hidden_size or model.ffn_hidden_size
    out: dict[str, tuple[int, int]] = {}
    for e in range(model.num_experts):
        x = f"{prefix}.block_sparse_moe.experts.{e}"
        out |= {f"{x}.w1": (f, h), f"{x}.w3": (f, h), f"{x}.w2": (h, f)}
    return out


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
