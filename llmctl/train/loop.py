"""The training loop: megatron-core schedules, optimizer step, LR schedule, validation, metrics.

One `train()` call runs a whole job on this rank, after `parallel.init_distributed`. The loop
itself is megatron's: `get_forward_backward_func()` picks no-pipelining, 1F1B or interleaved
1F1B from the parallel state; DDP reduces gradients in `finalize_model_grads`; the megatron
optimizer clips and steps. The loss logged is the mean over micro-batches and DP ranks,
all-reduced from the last pipeline stage so rank 0 (first stage) can show it.

Checkpointing plugs in through the `Checkpointer` protocol (`load` before the first step,
`after_step` after each optimizer step, `close` at the end); `TrainState` holds everything a
checkpoint must keep (model chunks, optimizer, scheduler, step, consumed samples, data
iterators). The default checkpointer does nothing.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from llmctl.plan import Layout

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train")


@dataclass
class TrainState:
    """Mutable state of a run: what a checkpoint saves and restores."""

    cfg: RootConfig
    layout: Layout
    run_dir: Path
    model: list[Any]
    optimizer: Any
    scheduler: Any
    train_iters: list[Any]
    step: int = 0
    consumed_samples: int = 0

    def set_position(self, step: int, consumed_samples: int) -> None:
        """Move the step counter and every data iterator to a saved position (resume)."""
        self.step, self.consumed_samples = step, consumed_samples
        for it in self.train_iters:
            it.load_state_dict({"consumed_samples": consumed_samples})


class Checkpointer(Protocol):
    """Seam for checkpointing (issue 5): called by the loop at fixed points."""

    def load(self, state: TrainState) -> None:
        """Restore `state` in place from the newest complete checkpoint, if any."""

    def after_step(self, state: TrainState) -> None:
        """Called after every optimizer step; saves when the policy says so."""

    def close(self, state: TrainState) -> None:
        """Called once at the end (final save, wait for async writes)."""


class NullCheckpointer:
    """Checkpointing off."""

    def load(self, state: TrainState) -> None:
        """Nothing to load."""
        del state

    def after_step(self, state: TrainState) -> None:
        """Nothing to save."""
        del state

    def close(self, state: TrainState) -> None:
        """Nothing to finish."""
        del state


@dataclass
class TrainResult:
    """What a finished run returns (rank 0 holds the logged losses; others hold NaN)."""

    run_dir: Path
    steps: int
    losses: list[float] = field(default_factory=list)
    val_losses: dict[int, float] = field(default_factory=dict)
    perf: dict[str, Any] | None = None

    @property
    def final_loss(self) -> float:
        """Loss of the last step (NaN if none ran)."""
        return self.losses[-1] if self.losses else math.nan


def _loss_func(loss_mask: Any, output_tensor: Any) -> tuple[Any, dict[str, Any]]:
    """Token-mean cross entropy of one micro-batch; the report value is detached."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = (losses * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {"lm loss": loss.detach().clone()}  # clone: megatron divides `loss` in place


def _forward_step(data_iterator: Any, model: Any, device: Any) -> tuple[Any, Any]:
    batch = next(data_iterator)
    tokens = batch["tokens"].to(device, non_blocking=True)
    labels = batch["labels"].to(device, non_blocking=True)
    position_ids = batch["position_ids"].to(device, non_blocking=True)
    loss_mask = batch["loss_mask"].to(device, non_blocking=True)
    mask = batch.get("attention_mask")  # SFT packs: causal within each example only
    attention_mask = None if mask is None else mask.to(device, non_blocking=True)
    output = model(tokens, position_ids, attention_mask, labels=labels)
    if model.config.calculate_per_token_loss:  # SFT: see llmctl.train.token_loss
        from llmctl.train.token_loss import token_loss_func

        return output, partial(token_loss_func, loss_mask)
    return output, partial(_loss_func, loss_mask)


def _reduce_loss(losses_reduced: list[dict[str, Any]], device: Any) -> float:
    """Mean loss over micro-batches and DP ranks, made visible on every pipeline stage."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if losses_reduced and losses_reduced[0]["lm loss"].dim() == 1:  # per-token (SFT)
        from llmctl.train.token_loss import reduce_token_loss

        return reduce_token_loss(losses_reduced, device)
    if losses_reduced:
        local = torch.stack([x["lm loss"].float() for x in losses_reduced]).mean()
    else:
        local = torch.zeros((), device=device)
    if losses_reduced:
        dist.all_reduce(local, group=ps.get_data_parallel_group())
        local = local / ps.get_data_parallel_world_size()
    if ps.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(local, group=ps.get_pipeline_model_parallel_group())
    return float(local.item())


class Trainer:
    """Builds everything for one run on this rank and runs the steps."""

    def __init__(self, cfg: RootConfig, layout: Layout, run_dir: Path, data_spec: Any) -> None:
        import torch
        from megatron.core import parallel_state as ps

        from llmctl.run.planning import loss_balanced_stage_layers
        from llmctl.run.precision import check_precision, has_transformer_engine
        from llmctl.train import data as data_mod
        from llmctl.train import lora, optim
        from llmctl.train import model as model_mod

        self.cfg, self.layout, self.run_dir = cfg, layout, run_dir
        self.on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else "cpu"
        use_te = self.on_gpu and has_transformer_engine()
        recipe = check_precision(cfg.precision, has_cuda=self.on_gpu, has_te=use_te)
        self.recipe = recipe
        self.config = model_mod.transformer_config(
            cfg.model,
            layout,
            cfg.precision,
            recipe,
            on_gpu=self.on_gpu,
            use_te=use_te,
            per_token_loss=bool(getattr(data_spec, "sft", False)),
            stage_layers=loss_balanced_stage_layers(cfg, layout),
        )
        chunks = model_mod.build_model_chunks(
            cfg.model, self.config, layout, use_te=use_te, seed=cfg.train.seed
        )
        model_mod.freeze_embeddings(chunks, cfg.train, cfg.model, layout.pp)
        lora.apply_lora(chunks, cfg, layout)  # train.peft=lora: frozen base + adapters
        if self.on_gpu:
            for c in chunks:
                c.cuda(torch.cuda.current_device())
        if self.config.bf16 or self.config.fp16:  # half inputs in, fp32 logits/loss out
            from megatron.core.transformer.module import Float16Module

            chunks = [Float16Module(self.config, c) for c in chunks]
        grad_dtype = str(getattr(cfg.precision, "grad_dtype", None) or "fp32")
        self.model = optim.wrap_ddp(
            chunks,
            self.config,
            layout,
            on_gpu=self.on_gpu,
            grad_reduce_in_fp32=grad_dtype == "fp32",
        )
        self.optimizer = optim.build_optimizer(cfg, self.model, self.config, layout)
        self.scheduler = optim.build_scheduler(cfg, self.optimizer)

        t = cfg.train
        gbs = cfg.train.global_batch_size
        num_evals = (t.train_iters // t.eval_interval + 1) if t.eval_interval > 0 else 0
        train_ds, valid_ds = data_mod.build_datasets(
            cfg, data_spec, t.train_iters * gbs, max(num_evals * t.eval_iters * gbs, 1)
        )
        self.valid_ds = valid_ds
        self.dp_rank, self.dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        iters = [
            data_mod.MicroBatches(train_ds, layout.micro_batch_size, self.dp_rank, self.dp)
            for _ in self.model
        ]
        self.state = TrainState(
            cfg=cfg,
            layout=layout,
            run_dir=run_dir,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            train_iters=iters,
        )
        self.guard: Any = None  # llmctl.train.divergence.DivergenceGuard (train.health)
        from llmctl.train.dpo import objective_for

        self.dpo = objective_for(cfg)  # train.objective=dpo: pairs, reference, rewards

    def _data_arg(self, iters: list[Any]) -> Any:
        return iters if len(iters) > 1 else iters[0]

    def _forward_backward(self, iters: list[Any], forward_only: bool) -> list[dict[str, Any]]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        fb = get_forward_backward_func()
        return fb(  # type: ignore[no-any-return]
            forward_step_func=partial(
                self.dpo.forward_step if self.dpo else _forward_step, device=self.device
            ),
            data_iterator=self._data_arg(iters),
            model=self.model if len(self.model) > 1 else self.model[0],
            num_microbatches=self.layout.num_microbatches(self.cfg.train.global_batch_size),
            seq_length=self.cfg.model.seq_length,
            micro_batch_size=self.layout.micro_batch_size,
            forward_only=forward_only,
        )

    def train_step(self) -> tuple[float, float | None]:
        """One optimizer step. Returns (loss, grad norm)."""
        for m in self.model:
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        losses = self._forward_backward(self.state.train_iters, forward_only=False)
        if self.dpo is not None:
            self.dpo.observe(losses, self.device)
        loss = _reduce_loss(losses, self.device)  # before the step: the divergence check
        if self.guard is not None:  # llmctl.train.divergence: checks, then steps
            ok, grad_norm = self.guard.step(self.optimizer, loss, self.state)
        else:
            ok, grad_norm, _ = self.optimizer.step()
        if ok:
            self.scheduler.step(increment=1)
        self.state.step += 1
        self.state.consumed_samples += self.cfg.train.global_batch_size
        return loss, (None if grad_norm is None else float(grad_norm))

    def evaluate(self) -> float:
        """Mean validation loss over `train.eval_iters` steps (same batches every time)."""
        import torch

        from llmctl.train.data import MicroBatches

        if self.valid_ds is None or len(self.valid_ds) == 0:
            return math.nan
        iters = [
            MicroBatches(self.valid_ds, self.layout.micro_batch_size, self.dp_rank, self.dp)
            for _ in self.model
        ]
        for m in self.model:
            m.eval()
        total = 0.0
        with torch.no_grad():
            for _ in range(self.cfg.train.eval_iters):
                out = self._forward_backward(iters, True)
                if self.dpo is not None:
                    self.dpo.observe(out, self.device, val=True)
                total += _reduce_loss(out, self.device)
        for m in self.model:
            m.train()
        return float(total / max(self.cfg.train.eval_iters, 1))

    def current_lr(self) -> float:
        """Learning rate of the first param group."""
        return float(self.optimizer.param_groups[0]["lr"])

    def sync(self) -> None:
        """Wait for the device (GPU) so wall-clock step times are honest."""
        import torch

        if self.on_gpu:
            torch.cuda.synchronize()
