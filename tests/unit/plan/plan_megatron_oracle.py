"""Count parameters per rank of real megatron-core GPTModels on CPU (the oracle of test_params).

Run by `test_params_match_megatron` in 2 spawned gloo ranks: for each shape and each (TP, PP)
in {(1, 1), (2, 1), (1, 2)}, every rank builds its model chunk with the local (non-TE) layer
spec and reports `sum(p.numel())`. Not a test module (no `test_` prefix).
"""

from __future__ import annotations

import os
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "llama_gqa": dict(
        num_layers=4,
        hidden_size=64,
        ffn_hidden_size=160,
        num_attention_heads=8,
        num_query_groups=2,
        vocab_size=256,
        swiglu=True,
        rmsnorm=True,
        bias=False,
        tied=False,
        rope=True,
        experts=0,
    ),
    "gpt_mha_tied": dict(
        num_layers=2,
        hidden_size=48,
        ffn_hidden_size=192,
        num_attention_heads=4,
        num_query_groups=4,
        vocab_size=128,
        swiglu=False,
        rmsnorm=False,
        bias=True,
        tied=True,
        rope=False,
        experts=0,
    ),
    "moe_top2": dict(
        num_layers=2,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        vocab_size=64,
        swiglu=True,
        rmsnorm=True,
        bias=False,
        tied=False,
        rope=True,
        experts=4,
    ),
}
SEQ = 16
LAYOUTS = ((1, 1), (2, 1), (1, 2))
#: MoE layouts (TP, EP, ETP) on 2 ranks: experts split over ETP, not TP (Bridge's Qwen3 runs).
EXPERT_LAYOUTS = ((2, 2, 1), (2, 1, 1), (1, 2, 1))


def _build(
    shape: dict[str, Any],
    tp: int,
    pp: int,
    dtype: Any = None,
    keep: bool = False,
    ep: int = 1,
    etp: int | None = None,
) -> int:
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from llmctl.train import cpu_compat
    from llmctl.train.cpu_compat import CPU_KERNEL_FLAGS

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )
    cpu_compat.seed_model_parallel_rng(1234, ps.get_tensor_model_parallel_rank())
    norm = "RMSNorm" if shape["rmsnorm"] else "LayerNorm"
    cfg = TransformerConfig(
        num_layers=shape["num_layers"],
        hidden_size=shape["hidden_size"],
        ffn_hidden_size=shape["ffn_hidden_size"],
        num_attention_heads=shape["num_attention_heads"],
        num_query_groups=shape["num_query_groups"],
        normalization=norm,
        gated_linear_unit=shape["swiglu"],
        activation_func=F.silu if shape["swiglu"] else F.gelu,
        add_bias_linear=shape["bias"],
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        **CPU_KERNEL_FLAGS,
        params_dtype=dtype or torch.float32,
        pipeline_dtype=dtype or torch.float32,
        bf16=dtype is torch.bfloat16,
        num_moe_experts=shape["experts"] or None,
        moe_router_topk=2,
        moe_ffn_hidden_size=shape["ffn_hidden_size"] if shape["experts"] else None,
    )
    spec = get_gpt_layer_local_spec(num_experts=shape["experts"] or None, normalization=norm)
    model = GPTModel(
        config=cfg,
        transformer_layer_spec=spec,
        vocab_size=shape["vocab_size"],
        max_sequence_length=SEQ,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=shape["tied"],
        position_embedding_type="rope" if shape["rope"] else "learned_absolute",
    )
    if keep:
        _MODEL[:] = [model]
    return sum(p.numel() for p in model.parameters())


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One gloo rank: count every (shape, layout) and write `rank<r>.json`."""
    import json

    import torch.distributed as dist

    from llmctl.train import cpu_compat

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu_compat.install()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    counts = {
        f"{name}/{tp}/{pp}": _build(shape, tp, pp)
        for name, shape in SHAPES.items()
        for tp, pp in LAYOUTS
    }
    for tp, ep, etp in EXPERT_LAYOUTS:
        key = f"moe_top2/tp{tp}/ep{ep}/etp{etp}"
        counts[key] = _build(SHAPES["moe_top2"], tp, 1, ep=ep, etp=etp)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(counts, fh)
    dist.destroy_process_group()


def _grad_buffer_bytes(grad_reduce_in_fp32: bool) -> dict[str, int]:
    """Build the llama_gqa shape in bf16, wrap it in megatron-core's DDP, count its buffers."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    params = _build(SHAPES["llama_gqa"], 1, 1, dtype=torch.bfloat16, keep=True)
    model = _MODEL[0]
    ddp = DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=grad_reduce_in_fp32, use_distributed_optimizer=True
        ),
        module=model,
    )
    grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in ddp.buffers)
    return {"params": params, "grad_bytes": int(grads)}


_MODEL: list[Any] = []


def ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One gloo rank: megatron-core DDP grad-buffer bytes with and without fp32 reduction."""
    import json

    import torch.distributed as dist

    from llmctl.train import cpu_compat

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu_compat.install()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = {str(fp32): _grad_buffer_bytes(fp32) for fp32 in (True, False)}
    with open(os.path.join(out_dir, "ddp.json"), "w") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()
