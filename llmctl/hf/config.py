"""Hugging Face `config.json` <-> llmctl's model config group, for the supported families.

Import reads the config through transformers' own class (`AutoConfig`, local files only), so
defaults and legacy keys (`rope_theta`/`rope_scaling` before transformers 5) are resolved the
way transformers resolves them when it runs the model. Anything GPTModel cannot express is
refused here, before a byte of weights is read, naming the config field.

Vocabulary: megatron splits the embedding and the logits by rows over TP ranks, so the vocab is
padded to a multiple of `vocab_multiple` (128 by default: any TP up to 128 that is a power of
two divides it). Padded rows are zero; their logits are 0, which the import's oracles exclude
(they compare the first `hf_vocab_size` logits) and export drops again.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.hf.mapping import FAMILIES, Family, head_dim

if TYPE_CHECKING:
    from llmctl.config.schema import ModelConfig

# Llama 3.1's RoPE scaling with the constants megatron-core's RotaryEmbedding hard-codes.
LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
DEFAULT_SEQ_LENGTH = 4096


def load_hf_config(src: Path) -> Any:
    """transformers' config object of a model directory (no network).

    Raises:
        UserError: No config.json, or transformers cannot read it.
    """
    if not (src / "config.json").is_file():
        raise UserError(f"{src} is not a Hugging Face model directory (no config.json)")
    try:
        from transformers import AutoConfig
    except ImportError as e:
        raise UserError(
            f"llmctl import hf needs transformers ({e}): pip install 'llmctl[quant]'"
        ) from e

    try:
        return AutoConfig.from_pretrained(str(src), local_files_only=True)
    except (ValueError, KeyError, OSError) as e:
        raise UserError(f"{src}/config.json: transformers cannot read it ({e})") from e


def family_of(config: Any, src: Path) -> Family:
    """The supported family of a config, by `architectures[0]`.

    Raises:
        UserError: An architecture llmctl does not import.
    """
    archs = list(getattr(config, "architectures", None) or [])
    if not archs:
        raise UserError(f"{src}/config.json: no `architectures` entry; cannot tell the model class")
    if archs[0] not in FAMILIES:
        raise UserError(
            f"{src}/config.json: architectures={archs[0]} is not supported; llmctl imports "
            f"{', '.join(FAMILIES)}"
        )
    return FAMILIES[archs[0]]


def rope_of(config: Any) -> dict[str, Any]:
    """RoPE parameters: `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if not rope:
        rope = dict(getattr(config, "rope_scaling", None) or {})
        rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.get("type", "default"))
    return rope


def _rope_scaling_factor(rope: dict[str, Any], where: str) -> float | None:
    kind = rope["rope_type"]
    if kind == "default":
        return None
    if kind != "llama3":
        raise UserError(
            f"{where}: rope_scaling.rope_type={kind} cannot be expressed by megatron-core's "
            "GPTModel (it has Llama 3.1 scaling only)"
        )
    for key, want in LLAMA3_ROPE.items():
        if float(rope.get(key, want)) != want:
            raise UserError(
                f"{where}: rope_scaling.{key}={rope.get(key)}; megatron-core's Llama 3.1 RoPE "
                f"scaling is fixed at {key}={want}"
            )
    return float(rope["factor"])


def _refuse(config: Any, family: Family, where: str) -> None:
    """Refuse what GPTModel cannot express, naming the field."""
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else type(quant).__name__
        raise UserError(
            f"{where}: quantization_config ({method}) is set: the weights are quantized; "
            "llmctl imports unquantized (fp32/bf16/fp16) models, import the one it was made from"
        )
    checks = [
        ("hidden_act", getattr(config, "hidden_act", "silu"), "silu"),
        ("attention_bias", bool(getattr(config, "attention_bias", False)), False),
        ("mlp_bias", bool(getattr(config, "mlp_bias", False)), False),
        ("use_sliding_window", bool(getattr(config, "use_sliding_window", False)), False),
        ("qk_layernorm", bool(getattr(config, "qk_layernorm", False)), False),
    ]
    for name, have, want in checks:
        if have != want:
            raise UserError(
                f"{where}: {name}={have} cannot be expressed by llmctl's megatron-core GPTModel "
                f"for {family.architecture} (expected {want})"
            )


def padded_vocab(vocab: int, multiple: int, tp: int) -> int:
    """`vocab` rounded up to a multiple of `multiple`; must also split over `tp` ranks.

    Raises:
        UserError: A multiple < 1, or a padded size `tp` does not divide.
    """
    if multiple < 1:
        raise UserError(f"--vocab-multiple must be >= 1, got {multiple}")
    if tp < 1:
        raise UserError(f"--tp must be >= 1, got {tp}")
    padded = math.ceil(vocab / multiple) * multiple
    if padded % tp:
        raise UserError(
            f"vocab {vocab} padded to {padded} (a multiple of {multiple}) does not split over "
            f"tp={tp}; pass --vocab-multiple {math.lcm(multiple, tp)}"
        )
    return padded


def sliding_window(config: Any) -> int | None:
    """The attention window a Hugging Face config applies (Mistral, Mixtral), or None.

    Qwen2's window only applies with `use_sliding_window: true`, which import refuses.
    """
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        return int(window)
    return None


def _seq_length(config: Any) -> int:
    """Training sequence length: the context, capped; never past a sliding window (Mistral),
    within which full causal attention (what megatron-core trains here) is the same."""
    seq = min(int(config.max_position_embeddings), DEFAULT_SEQ_LENGTH)
    window = sliding_window(config)
    return min(seq, window) if window else seq


def model_fields(
    config: Any, src: Path, *, name: str, vocab_multiple: int = 128, tp: int = 1
) -> dict[str, Any]:
    """llmctl `ModelConfig` fields of a Hugging Face config.

    Args:
        config: transformers config object.
        src: The model directory (for messages).
        name: `model.name` of the result.
        vocab_multiple: Pad the vocabulary to a multiple of this.
        tp: Largest TP the checkpoint must load at (checked against the padded vocab).

    Raises:
        UserError: A family or field GPTModel cannot express.
    """
    where = f"{src}/config.json"
    family = family_of(config, src)
    _refuse(config, family, where)
    rope = rope_of(config)
    heads, hidden = int(config.num_attention_heads), int(config.hidden_size)
    dim = int(getattr(config, "head_dim", None) or hidden // heads)
    experts = int(getattr(config, "num_local_experts", 0) or 0) if family.moe else 0
    vocab = int(config.vocab_size)
    return {
        "name": name,
        "family": "llama",
        "num_layers": int(config.num_hidden_layers),
        "hidden_size": hidden,
        "ffn_hidden_size": int(config.intermediate_size),
        "num_attention_heads": heads,
        "num_query_groups": int(getattr(config, "num_key_value_heads", None) or heads),
        "kv_channels": None if dim * heads == hidden else dim,
        "vocab_size": padded_vocab(vocab, vocab_multiple, tp),
        "hf_vocab_size": vocab,
        "seq_length": _seq_length(config),
        "max_position_embeddings": int(config.max_position_embeddings),
        "normalization": "rmsnorm",
        "activation": "swiglu",
        "position_embedding": "rope",
        "rotary_base": float(rope["rope_theta"]),
        "rope_scaling_factor": _rope_scaling_factor(rope, where),
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "add_bias_linear": False,
        "add_qkv_bias": family.qkv_bias,
        "num_experts": experts,
        "moe_router_topk": int(getattr(config, "num_experts_per_tok", 2) or 2),
        "moe_ffn_hidden_size": int(config.intermediate_size) if experts else None,
        "init_method_std": float(getattr(config, "initializer_range", 0.02)),
        "norm_epsilon": float(config.rms_norm_eps),
        "hf_architecture": family.architecture,
        "hf_sliding_window": sliding_window(config),
    }


def architecture_of(model: ModelConfig) -> str:
    """The Hugging Face class a Llama-style `cfg.model` exports as."""
    if getattr(model, "hf_architecture", None):
        return str(model.hf_architecture)
    if model.num_experts:
        return "MixtralForCausalLM"
    return "Qwen2ForCausalLM" if getattr(model, "add_qkv_bias", False) else "LlamaForCausalLM"


def _rope_parameters(model: ModelConfig) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(model.rotary_base)}
    factor = getattr(model, "rope_scaling_factor", None)
    if factor:
        rope |= {"rope_type": "llama3", "factor": float(factor), **LLAMA3_ROPE}
    return rope


def hf_config_kwargs(model: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    """Keyword arguments of the transformers config class for `cfg.model` (shared fields)."""
    kwargs: dict[str, Any] = {
        "vocab_size": int(getattr(model, "hf_vocab_size", None) or model.vocab_size),
        "hidden_size": model.hidden_size,
        "intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_query_groups,
        "head_dim": head_dim(model),
        "max_position_embeddings": model.max_position_embeddings or model.seq_length,
        "rms_norm_eps": model.norm_epsilon,
        "rope_parameters": _rope_parameters(model),
        "tie_word_embeddings": bool(model.tied_embeddings),
        "hidden_act": "silu",
        "initializer_range": model.init_method_std,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
    }  # fmt: skip
    if model.num_experts:
        kwargs |= {
            "num_local_experts": model.num_experts,
            "num_experts_per_tok": model.moe_router_topk,
        }
    return kwargs


def hf_config_dict(model: ModelConfig, eos_id: int | None, dtype: str) -> dict[str, Any]:
    """config.json contents for a Llama-style `cfg.model`, through transformers' own class."""
    import transformers

    arch = architecture_of(model)
    kwargs = hf_config_kwargs(model, eos_id)
    if arch == "LlamaForCausalLM":
        kwargs |= {
            "attention_bias": bool(model.add_bias_linear),
            "mlp_bias": bool(model.add_bias_linear),
        }
    if arch in ("MistralForCausalLM", "MixtralForCausalLM"):  # the imported window, or none
        kwargs["sliding_window"] = getattr(model, "hf_sliding_window", None)
    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    data: dict[str, Any] = cls(architectures=[arch], **kwargs).to_dict()
    for noise in ("id2label", "label2id", "return_dict", "output_hidden_states",
                  "output_attentions", "chunk_size_feed_forward", "problem_type",
                  "is_encoder_decoder", "_name_or_path"):  # fmt: skip
        data.pop(noise, None)
    data["dtype"] = data["torch_dtype"] = dtype  # older readers (4.x, vLLM) look for torch_dtype
    data["rope_theta"] = float(model.rotary_base)
    return data
