"""Megatron DDP, the megatron optimizer (AdamW) and the warmup + cosine LR schedule.

What runs where: the distributed optimizer (ZeRO-1, `parallel.optimizer_sharding=distributed`)
trains correctly on CPU with gloo, but its checkpoints are only partly loadable in
megatron-core 0.16.1 on the torch-Adam path (see docs/train.md), so the default on CPU is the
plain optimizer; GPU runs use what the layout asks for. Gradient reduction is in fp32 unless
`precision.grad_dtype` says otherwise (`grad_reduce_in_fp32`); with DP > 1 on GPU it overlaps
the backward pass.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from llmctl.plan import Layout

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger(__name__)


def wrap_ddp(
    chunks: list[Any],
    config: Any,
    layout: Layout,
    *,
    on_gpu: bool,
    grad_reduce_in_fp32: bool = True,
) -> list[Any]:
    """Wrap each model chunk in megatron's DistributedDataParallel and hook the grad sync.

    `grad_reduce_in_fp32` (from `precision.grad_dtype`, fp32 unless set) is the dtype of
    megatron-core's grad buffer and reduction, as the planner assumes.
    """
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    if layout.optimizer_sharding == "full":
        return _wrap_fsdp(chunks, config, grad_reduce_in_fp32=grad_reduce_in_fp32)
    overlap = on_gpu and layout.dp > 1
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32,
        overlap_grad_reduce=overlap,
        use_distributed_optimizer=layout.optimizer_sharding == "distributed",
    )
    wrapped = [
        DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0
        )
        for i, chunk in enumerate(chunks)
    ]
    for m in wrapped:
        m.broadcast_params()
    config.no_sync_func = [m.no_sync for m in wrapped]
    if len(wrapped) == 1:
        config.no_sync_func = config.no_sync_func[0]
    if overlap:
        config.grad_sync_func = [m.start_grad_sync for m in wrapped]
        if len(wrapped) == 1:
            config.grad_sync_func = config.grad_sync_func[0]
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped


def _wrap_fsdp(chunks: list[Any], config: Any, *, grad_reduce_in_fp32: bool) -> list[Any]:
    """Shard each chunk with megatron-core's torch FSDP2 wrapper (ZeRO-3).

    Parameters, gradients and optimizer state are sharded over the data-parallel group; each
    transformer layer and the embedding gather their parameters just in time and free them
    after forward (`reshard_after_forward`). Gradients are reduce-scattered (averaged) after
    every micro-batch's backward: the wrapper has no `no_sync`.
    """
    fsdp_cls = fsdp_class()
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.distributed.torch_fully_sharded_data_parallel_config import (
        TorchFullyShardedDataParallelConfig,
    )

    fsdp_config = TorchFullyShardedDataParallelConfig(grad_reduce_in_fp32=grad_reduce_in_fp32)
    wrapped = [fsdp_cls(config=config, ddp_config=fsdp_config, module=c) for c in chunks]
    held, total = fsdp_shard_numel(wrapped)
    log.info("FSDP: this rank holds %d of %d parameter elements", held, total)
    config.no_sync_func = None
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped


def fsdp_shard_numel(chunks: list[Any]) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole parameters) over FSDP chunks."""
    held = total = 0
    for chunk in chunks:
        for param in chunk.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            held += local.numel()
            total += param.numel()
    return held, total


def fsdp_class() -> type:
    """megatron-core's `TorchFullyShardedDataParallel` with the two hooks 0.16.1 lacks.

    `finalize_model_grads` calls `finish_grad_sync(force_all_reduce=...)`, which the base
    class does not accept (FSDP2 has already reduce-scattered), and per-token loss
    normalisation calls `scale_gradients`, a no-op in the base class: here it scales the
    local gradient shards.
    """
    from megatron.core.distributed.torch_fully_sharded_data_parallel import (
        TorchFullyShardedDataParallel,
    )

    class Fsdp(TorchFullyShardedDataParallel):  # type: ignore[misc]
        def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
            del force_all_reduce

        def scale_gradients(self, scaling_factor: float) -> None:
            for param in self.module.parameters():
                if param.grad is not None:
                    param.grad.mul_(scaling_factor)

    return Fsdp


def build_optimizer(cfg: RootConfig, model: list[Any], config: Any, layout: Layout) -> Any:
    """megatron's optimizer (Adam with decoupled weight decay) over all chunks."""
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer import optimizer_config as oc

    # AdamOptimizerConfig where it exists (the generic class's Adam fields are deprecated).
    config_cls = getattr(oc, "AdamOptimizerConfig", oc.OptimizerConfig)
    t = cfg.train
    opt_config = config_cls(
        optimizer="adam",
        lr=t.lr,
        min_lr=t.min_lr,
        weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2,
        adam_eps=t.adam_eps,
        clip_grad=t.clip_grad,
        bf16=config.bf16,
        fp16=config.fp16,
        params_dtype=config.params_dtype,
        use_distributed_optimizer=layout.optimizer_sharding == "distributed",
    )
    return get_megatron_optimizer(opt_config, model)


def build_scheduler(cfg: RootConfig, optimizer: Any) -> Any:
    """Linear warmup to `train.lr`, cosine decay to `train.min_lr`; steps count iterations."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    t = cfg.train
    decay = t.lr_decay_iters or t.train_iters
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=t.lr,
        min_lr=t.min_lr,
        lr_warmup_steps=min(t.warmup_iters, max(decay - 1, 0)),
        lr_decay_steps=max(decay, 1),
        lr_decay_style="cosine",
        start_wd=t.weight_decay,
        end_wd=t.weight_decay,
        wd_incr_steps=max(t.train_iters, 1),
        wd_incr_style="constant",
    )
