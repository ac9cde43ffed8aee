"""Build megatron-core's GPTModel (one chunk per virtual pipeline stage) from llmctl's config.

Llama-style models use RMSNorm, SwiGLU (gated linear unit with SiLU), RoPE, GQA and untied
embeddings; GPT-style use LayerNorm, GeLU and learned absolute positions. Both are just
field values of `ModelConfig`; nothing here branches on the family name. On GPU the Transformer
Engine layer spec is used (required for FP8; fused kernels); on CPU the local spec, with every
fusion off and CPU initialisation (megatron's fused kernels and TE are CUDA-only).
"""

from __future__ import annotations

import os
from typing import Any

from llmctl.plan import Layout
from llmctl.run.precision import (
    PrecisionRecipe,
    megatron_attention_backend,
    megatron_precision_kwargs,
)

#: Environment variables megatron-core's `LanguageModule` sets for Transformer Engine.
_NVTE_VARS = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


def _value(x: Any) -> str:
    return str(getattr(x, "value", x))


def _recompute_kwargs(layout: Layout) -> dict[str, Any]:
    if layout.recompute == "full":
        return {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    if layout.recompute == "selective":
        return {"recompute_granularity": "selective"}
    return {}


def _moe_overlap_kwargs(layout: Layout) -> dict[str, Any]:
    """`parallel.moe_a2a_overlap`: megatron-core's overlap_moe_expert_parallel_comm, which
    its TransformerConfig accepts only with the all-to-all (or flex) token dispatcher."""
    if not layout.moe_a2a_overlap:
        return {}
    return {"overlap_moe_expert_parallel_comm": True, "moe_token_dispatcher_type": "alltoall"}


def _device_kwargs(model: Any, *, on_gpu: bool, use_te: bool) -> dict[str, Any]:
    """Fusions, init placement and pipeline p2p mode.

    Fused kernels need CUDA: weight-gradient accumulation, persistent LayerNorm, masked softmax
    and RoPE fusion need Transformer Engine (or Apex) as well; bias+activation and
    bias+dropout fusions are torch-scripted and need only CUDA (bias+GeLU only with a bias).
    `batch_p2p_comm` is off on CPU: with gloo, batched isend/irecv in both directions at once
    (the interleaved schedule's steady state, micro-batches > PP) gave wrong activations
    (step-1 loss 8.3738 instead of 8.3743, measured); separate send/recv ops match TP=1 exactly.
    `transformer_impl` names the layer spec built (`layer_spec`): megatron-core's torch FSDP2
    wrapper reads it to choose the submodules it shards on their own.
    """
    te = on_gpu and use_te
    gated = _value(model.activation) == "swiglu"
    return {
        "batch_p2p_comm": on_gpu,
        "use_cpu_initialization": not on_gpu,
        "gradient_accumulation_fusion": te,
        "bias_activation_fusion": on_gpu and (gated or model.add_bias_linear),
        "masked_softmax_fusion": te,
        "bias_dropout_fusion": on_gpu,
        "apply_rope_fusion": te and _value(model.position_embedding) == "rope",
        "persist_layer_norm": te,
        "transformer_impl": "transformer_engine" if te else "local",
    }


def transformer_config(
    model: Any,
    layout: Layout,
    precision: Any,
    recipe: PrecisionRecipe,
    *,
    on_gpu: bool,
    use_te: bool = False,
    per_token_loss: bool = False,
    stage_layers: list[int] | None = None,
) -> Any:
    """megatron `TransformerConfig` for the model, layout and precision.

    Args:
        model: `cfg.model`.
        layout: The resolved layout.
        precision: `cfg.precision`.
        recipe: The checked precision recipe.
        on_gpu: Whether CUDA (and the fused paths) are in use.
        use_te: Whether the Transformer Engine layer spec is used (enables TE-only fusions).
        per_token_loss: megatron's `calculate_per_token_loss` (SFT; llmctl.train.token_loss).
        stage_layers: Transformer layers per pipeline stage when they are not even
            (`plan.balance_loss`: `config.planning.loss_balanced_stage_layers`); megatron's
            `pipeline_model_parallel_layout`, the embedding on the first stage, the loss on the
            last.
    """
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    swiglu = _value(model.activation) == "swiglu"
    prec = megatron_precision_kwargs(precision, recipe)
    return TransformerConfig(
        attention_backend=AttnBackend[megatron_attention_backend(precision, use_te=use_te)],
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups,
        kv_channels=model.kv_channels,
        normalization="RMSNorm" if _value(model.normalization) == "rmsnorm" else "LayerNorm",
        layernorm_epsilon=model.norm_epsilon,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        add_bias_linear=model.add_bias_linear,
        add_qkv_bias=bool(getattr(model, "add_qkv_bias", False)),
        init_method_std=model.init_method_std,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_moe_experts=model.num_experts or None,
        moe_router_topk=model.moe_router_topk if model.num_experts else 2,
        moe_ffn_hidden_size=(model.moe_ffn_hidden_size if model.num_experts else None),
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.interleaved else None,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        **_moe_overlap_kwargs(layout),
        sequence_parallel=layout.sequence_parallel,
        pipeline_dtype=prec["params_dtype"] if layout.pp > 1 else None,
        deallocate_pipeline_outputs=True,
        variable_seq_lengths=False,
        calculate_per_token_loss=per_token_loss,
        pipeline_model_parallel_layout=_pipeline_layout(stage_layers),
        **_recompute_kwargs(layout),
        **_device_kwargs(model, on_gpu=on_gpu, use_te=use_te),
        **prec,
    )


def _pipeline_layout(stage_layers: list[int] | None) -> list[list[str]] | None:
    if not stage_layers:
        return None
    stages = [["decoder"] * n for n in stage_layers]
    stages[0].insert(0, "embedding")
    stages[-1].append("loss")
    return stages


def layer_spec(config: Any, model: Any, *, use_te: bool, seed: int | None = None) -> Any:
    """The transformer layer spec: Transformer Engine on GPU, megatron's local modules on CPU.

    With `seed` (local spec, CPU initialisation), each layer's weights are drawn from a
    generator reseeded with `seed + global layer number`, so the initial model is the same
    whatever the PP/VPP split (megatron draws layers from one running CPU stream otherwise,
    and a stage that starts at layer 3 would see a different stream than TP=1 does).
    """
    from megatron.core.models.gpt import gpt_layer_specs as specs

    num_experts = model.num_experts or None
    if use_te:
        return specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=False
        )
    spec = specs.get_gpt_layer_local_spec(
        num_experts=num_experts, normalization=config.normalization
    )
    if seed is not None:
        attn = spec.submodules.self_attention
        attn.module = _seeded(attn.module, seed)
    return spec


def _seeded(cls: type, seed: int) -> type:
    """Subclass of an attention module that reseeds the CPU RNG from its global layer number.

    Attention is the first randomly initialised module of a layer and receives the global
    (PP/VPP-offset) `layer_number`, so the whole layer's draws depend only on that number.
    """
    import torch

    def __init__(self: Any, *args: Any, layer_number: int, **kwargs: Any) -> None:
        torch.manual_seed(seed * 1009 + layer_number)
        cls.__init__(self, *args, layer_number=layer_number, **kwargs)  # type: ignore[misc]

    return type(f"Seeded{cls.__name__}", (cls,), {"__init__": __init__})


def _moe_without_te() -> None:
    """Make megatron-core's MoE router run without Transformer Engine.

    megatron-core 0.16.1's `RouterGatingLinearFunction` tests `te_general_gemm is not None`, a
    name `moe_utils` binds only when TE imports; without TE (CPU) every MoE forward raised
    NameError. None is what the non-TE branch expects.
    """
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def build_model_chunks(
    model: Any, config: Any, layout: Layout, *, use_te: bool, seed: int
) -> list[Any]:
    """One GPTModel per virtual pipeline stage held by this rank (one without VPP).

    Args:
        model: `cfg.model`.
        config: The `TransformerConfig` from `transformer_config`.
        layout: The resolved layout.
        use_te: Use the Transformer Engine layer spec.
        seed: Base seed of the run (layer-wise init seeds on CPU, see `layer_spec`).
    """
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    if model.num_experts:
        _moe_without_te()
    spec = layer_spec(config, model, use_te=use_te, seed=None if use_te else seed)
    torch.manual_seed(seed)
    rope = _value(model.position_embedding) == "rope"
    chunks = []
    # megatron sets NVTE_{FLASH,FUSED,UNFUSED}_ATTN for TE from config.attention_backend and
    # asserts on values set before; without TE they mean nothing: keep them out of os.environ
    # (and out of processes started later) so models with another backend can still be built.
    nvte = {k: os.environ.get(k) for k in _NVTE_VARS} if not use_te else {}
    for vp_stage in range(layout.vpp):
        vp = vp_stage if layout.interleaved else None
        chunk = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=model.vocab_size,
            max_sequence_length=model.max_position_embeddings or model.seq_length,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=model.tied_embeddings,
            position_embedding_type="rope" if rope else "learned_absolute",
            rotary_base=int(model.rotary_base),
            rope_scaling=bool(getattr(model, "rope_scaling_factor", None)),
            rope_scaling_factor=float(getattr(model, "rope_scaling_factor", None) or 8.0),
            vp_stage=vp,
        )
        chunks.append(chunk)
    for key, value in nvte.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    torch.manual_seed(seed)
    return chunks


def count_parameters(model: Any) -> int:
    """Parameters of the full (unsharded) model, from the config alone.

    Counts embeddings (and the output layer unless tied), per-layer attention (Q, K, V with GQA,
    output projection), MLP (two or three matrices for SwiGLU), norms, and optional biases.
    """
    h, f, v, n = model.hidden_size, model.ffn_hidden_size, model.vocab_size, model.num_layers
    head_dim = model.kv_channels or h // model.num_attention_heads
    q = model.num_attention_heads * head_dim
    kv = 2 * model.num_query_groups * head_dim
    attn = h * (q + kv) + q * h
    mats = 3 if _value(model.activation) == "swiglu" else 2
    mlp = mats * h * f * max(model.num_experts, 1)
    norms = 2 * h * (2 if _value(model.normalization) == "layernorm" else 1)
    bias = (q + kv + h + (mats - 1) * f + h) if model.add_bias_linear else 0
    embed = v * h * (1 if model.tied_embeddings else 2)
    pos = 0 if _value(model.position_embedding) == "rope" else model.seq_length * h
    final_norm = h * (2 if _value(model.normalization) == "layernorm" else 1)
    return int(n * (attn + mlp + norms + bias) + embed + pos + final_norm)


def freeze_embeddings(chunks: list[Any], train: Any, model: Any, pp: int) -> int:
    """Freeze the input embeddings when `train.freeze_embeddings` asks; returns params frozen.

    Frozen parameters get no gradient buffer in megatron's DDP and no optimizer state (its
    optimizer skips parameters that do not require gradients). With tied embeddings the output
    layer is the same tensor, so it is frozen too; with PP > 1 the last stage's copy would need
    its gradient all-reduced with the first stage's, which megatron does unconditionally, so
    that combination is refused.

    Raises:
        UserError: tied embeddings with PP > 1.
    """
    if not train.freeze_embeddings:
        return 0
    if model.tied_embeddings and pp > 1:
        from llmctl.errors import UserError

        raise UserError("train.freeze_embeddings with model.tied_embeddings needs pp=1")
    frozen = 0
    for chunk in chunks:
        inner = getattr(chunk, "module", chunk)
        embedding = getattr(inner, "embedding", None)
        if embedding is None:
            continue
        for p in embedding.parameters():
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen
