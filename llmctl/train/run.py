"""Run a whole training job on this rank: build, train, validate, observe, report.

`train()` expects `torch.distributed` started (`parallel.init_distributed`); `run_in_process`
does that for one rank so tests and notebooks can train without torchrun.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value as _v
from llmctl.memory import peak_rss_bytes
from llmctl.plan import Layout, PlanRecord
from llmctl.run.layout import layout_record, resolve_layout
from llmctl.run.metrics import (
    MetricsLog,
    PerfReport,
    StepMetrics,
    cpu_share,
    flops_per_token,
    peak_tflops_for,
    perf_markdown,
    quiet_step_s,
    rank_times,
    sched_ns,
    start_wandb,
    steady_state_step_s,
    write_perf,
)
from llmctl.train.loop import Checkpointer, Trainer, TrainResult

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train")


def _mem_gib(on_gpu: bool) -> float | None:
    """Memory in use now, GiB: the whole device on GPU, peak host RSS on CPU.

    On GPU this is `total - free` from the driver (cudaMemGetInfo), which counts what the
    planner's peak counts and PyTorch's allocator does not see: the CUDA context, NCCL buffers,
    allocator caching and fragmentation. It covers the whole device, so it assumes one training
    process per GPU (the launchers start exactly that).
    """
    if on_gpu:
        import torch

        free, total = torch.cuda.mem_get_info()
        return float(total - free) / 2**30
    return peak_rss_bytes() / 2**30


class _Observer:
    """Rank 0's metrics file, panel and wandb; a no-op on other ranks."""

    def __init__(
        self, cfg: RootConfig, run_dir: Path, layout: Layout, on_gpu: bool, rank: int, start: int
    ):
        from llmctl.train.panel import Panel

        self.rank0 = rank == 0
        self.on_gpu = on_gpu
        self.tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_length
        self.flops_per_step = flops_per_token(cfg.model) * self.tokens_per_step
        self.num_devices = layout.world_size
        self.peak = peak_tflops_for(cfg.cluster, _v(cfg.precision.dtype))
        self.total = cfg.train.train_iters
        self.step_times: list[float] = []
        self.losses: list[float] = []
        self.val_losses: dict[int, float] = {}
        self.peak_mem_gib: float | None = None
        self.cpu_share: float | None = None
        self.rank_cpu: list[list[float]] | None = None
        self.corrected_times: list[float] = []
        path = run_dir / "metrics.jsonl"
        self.metrics = MetricsLog(path, start_step=start) if self.rank0 else None
        mem_label = "GPU mem GiB" if on_gpu else "host RSS GiB"
        title = f"llmctl train: {cfg.recipe or cfg.model.name}"
        self.panel = Panel(title, self.total, mem_label, live=None if self.rank0 else False)
        self.wandb = start_wandb(cfg, run_dir, log) if self.rank0 else None
        self.prom: Any = None  # llmctl.run.prom.RankExporter, every rank (train.metrics)
        self.run_dir = run_dir
        self.events: list[dict[str, Any]] = []  # health events of the step being trained
        self.extra: dict[str, Any] = {}  # objective metrics of the step (DPO rewards)

    def step(
        self,
        step: int,
        loss: float,
        grad_norm: float | None,
        lr: float,
        dt: float,
        consumed: int,
        val_loss: float | None,
        log_now: bool,
    ) -> None:
        if self.prom is not None:
            self.prom.step(step, loss, grad_norm, lr, dt, self.rank_cpu)
        self.step_times.append(dt)
        if self.cpu_share is not None:
            self.corrected_times.append(dt * self.cpu_share)
        if self.on_gpu:  # every step, every rank: the peak may fall between logged steps
            self._sample_mem()
        self.losses.append(loss)
        if val_loss is not None:
            self.val_losses[step] = val_loss
        if not self.rank0 or not (log_now or self.events):
            return
        tflops = self.flops_per_step / dt / self.num_devices / 1e12
        m = StepMetrics(
            step=step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            step_time_s=dt,
            tokens_per_s=self.tokens_per_step / dt,
            tflops_per_device=tflops,
            mfu=None if not self.peak else tflops / self.peak,
            mem_gib=self._sample_mem(),
            consumed_samples=consumed,
            val_loss=val_loss,
            cpu_share=self.cpu_share,
            rank_cpu=self.rank_cpu,
        )
        events, self.events = self.events, []
        self._write_metrics(asdict(m) | self.extra | ({"events": events} if events else {}))
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in asdict(m).items() if v is not None}, step=step)
        eta = steady_state_step_s(self.step_times) * (self.total - step)
        self.panel.update(m, eta)

    def event(self, event: dict[str, Any], final: bool) -> None:
        """A health event (divergence): health.jsonl now, metrics.jsonl with its step's record
        (`final`: the run stops before that record, so it is written now)."""
        if not self.rank0:
            return
        from llmctl.run.health import append_event

        append_event(self.run_dir, event)
        if final:
            keep = ("step", "loss", "grad_norm")
            self._write_metrics({k: event[k] for k in keep} | {"events": [event]})
        else:
            self.events.append(event)

    def _write_metrics(self, record: dict[str, Any]) -> None:
        """Append to metrics.jsonl; a full or failing disk is logged once, not fatal (the
        checkpointer's failed-save policy decides whether the run goes on)."""
        if self.metrics is None:
            return
        try:
            self.metrics.write(record)
        except OSError as e:
            log.error("cannot write metrics.jsonl (%s); metrics of later steps are lost", e)
            with contextlib.suppress(OSError):
                self.metrics.close()
            self.metrics = None

    def _sample_mem(self) -> float | None:
        now = _mem_gib(self.on_gpu)
        if now is not None:
            self.peak_mem_gib = max(now, self.peak_mem_gib or 0.0)
        return self.peak_mem_gib

    def report(self, cfg: RootConfig, layout: Layout, plan: PlanRecord | None) -> PerfReport:
        step_s = steady_state_step_s(self.step_times)
        tflops = self.flops_per_step / step_s / self.num_devices / 1e12
        predicted_step_s = plan.step_time_s if plan else None
        return PerfReport(
            cluster=cfg.cluster.name,
            layout=layout_record(layout, cfg.train.global_batch_size),
            dtype=_v(cfg.precision.dtype),
            num_devices=self.num_devices,
            predicted_step_s=predicted_step_s,
            measured_step_s=step_s,
            predicted_peak_mem_gib=plan.peak_mem_gib if plan else None,
            measured_peak_mem_gib=self.peak_mem_gib if self.on_gpu else None,
            tokens_per_s=self.tokens_per_step / step_s,
            predicted_tokens_per_s=(plan.tokens_per_s if plan else None)
            or (self.tokens_per_step / predicted_step_s if predicted_step_s else None),
            tflops_per_device=tflops,
            mfu=None if not self.peak else tflops / self.peak,
            steps_measured=len(self.step_times),
            load_corrected_step_s=quiet_step_s(self.corrected_times),
        )

    def close(self) -> None:
        if self.prom is not None:
            self.prom.close()
        if self.metrics is not None:
            with contextlib.suppress(OSError):  # a full disk: already reported
                self.metrics.close()
        if self.wandb is not None:
            self.wandb.finish()


def train(
    cfg: RootConfig,
    run_dir: Path,
    *,
    data_spec: Any = None,
    plan: PlanRecord | None = None,
    checkpointer: Checkpointer | None = None,
) -> TrainResult:
    """Train on this rank (torch.distributed already started). Writes metrics and perf files.

    Args:
        cfg: The resolved `RootConfig`.
        run_dir: The run directory (exists; holds config.yaml).
        data_spec: Checked data inputs; None = `data.resolve_data(cfg)` here.
        plan: The run's plan (plan.json), for the layout and the predicted numbers.
        checkpointer: Checkpoint policy; None = no checkpoints.
    """
    import torch.distributed as dist

    from llmctl.run.precision import check_precision, has_transformer_engine
    from llmctl.train import parallel

    rank, world = dist.get_rank(), dist.get_world_size()
    layout = resolve_layout(cfg, world, plan.layout if plan else None)
    on_gpu = parallel.init_distributed().on_gpu
    check_precision(cfg.precision, has_cuda=on_gpu, has_te=on_gpu and has_transformer_engine())
    if data_spec is None:  # before megatron is imported: bad input fails in ~2 s, not ~7 s
        data_spec = _resolve_data_rank0_first(cfg, rank)
    parallel.init_model_parallel(layout, cfg.train.seed, on_gpu)
    try:
        return _train_loop(cfg, run_dir, layout, data_spec, plan, checkpointer, on_gpu, rank)
    finally:  # also on errors, so an in-process caller can start another run
        parallel.teardown(destroy_process_group=False)


def _cpu_share(
    wall_s: float, mine: tuple[float, float, float] | None, on_gpu: bool
) -> tuple[float | None, list[list[float]] | None]:
    """(`metrics.cpu_share`, `metrics.rank_cpu`) of this step; with several CPU ranks their
    `rank_times` are gathered first (one small gloo all-gather per step, outside the timed
    step)."""
    import torch
    import torch.distributed as dist

    if on_gpu or not dist.is_initialized() or dist.get_world_size() == 1:
        return (cpu_share(wall_s, [mine]), [list(mine)]) if mine else (None, None)
    row = torch.tensor(mine or (0.0, 0.0, 0.0), dtype=torch.float64)
    rows = [torch.zeros_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    ranks = [(r[0].item(), r[1].item(), r[2].item()) for r in rows]
    if any(r[0] <= 0 for r in ranks):
        return None, None
    return cpu_share(wall_s, ranks), [list(r) for r in ranks]


def _train_loop(
    cfg: RootConfig,
    run_dir: Path,
    layout: Layout,
    data_spec: Any,
    plan: PlanRecord | None,
    checkpointer: Checkpointer | None,
    on_gpu: bool,
    rank: int,
) -> TrainResult:
    trainer = Trainer(cfg, layout, run_dir, data_spec)
    if checkpointer is None:  # issue 5 seam: DistCheckpointer unless checkpointing is off
        from llmctl.train.checkpoint import make_checkpointer

        checkpointer = make_checkpointer(cfg, run_dir, plan)
    ckpt = checkpointer
    from llmctl.train.lora import load_base

    lora_base = load_base(trainer.state, cfg, run_dir)  # LoRA: the base on every start
    ckpt.load(trainer.state)
    if (
        trainer.state.step == 0 and cfg.checkpoint.init_from and not lora_base
    ):  # weights only (llmctl.train.init_from)
        from llmctl.train.init_from import init_weights

        init_weights(trainer.state, cfg, run_dir)
    if trainer.dpo is not None:  # the reference's log-probs, before step 1 (llmctl.train.dpo)
        trainer.dpo.prepare(trainer, run_dir)
    obs = _Observer(cfg, run_dir, layout, on_gpu, rank, trainer.state.step)
    t = cfg.train
    report = None
    from llmctl.train.divergence import make_guard
    from llmctl.train.watchdog import start_watchdog

    wd = start_watchdog(cfg, run_dir, rank, layout.world_size, plan)  # train.health.watchdog
    trainer.guard = make_guard(cfg, run_dir, ckpt, obs.event, wd)  # train.health.on_divergence
    try:
        from llmctl.run.prom import start_metrics

        obs.prom = start_metrics(
            cfg, run_dir, layout, rank=rank, on_gpu=on_gpu, plan=plan, ckpt=ckpt,
            start_step=trainer.state.step,
        )  # fmt: skip
        from llmctl.train.straggler import start_watch

        strag = start_watch(cfg, run_dir, trainer.config, rank=rank, on_gpu=on_gpu, prom=obs.prom)
        with obs.panel:
            while trainer.state.step < t.train_iters:
                t0, s0 = time.perf_counter(), sched_ns()
                wd.beat(trainer.state.step)
                strag.begin()
                loss, grad_norm = trainer.train_step()
                trainer.sync()
                dt = time.perf_counter() - t0
                strag.end(trainer.state.step, dt)
                wd.beat(trainer.state.step, wd.units_after(trainer.state.step), dt)
                obs.cpu_share, obs.rank_cpu = _cpu_share(dt, rank_times(dt, s0, sched_ns()), on_gpu)
                step = trainer.state.step
                val = None
                if t.eval_interval > 0 and (step % t.eval_interval == 0 or step == t.train_iters):
                    val = trainer.evaluate()
                log_now = step % max(t.log_interval, 1) == 0 or step == t.train_iters
                lr = trainer.current_lr()
                consumed = trainer.state.consumed_samples
                obs.extra = trainer.dpo.metrics() if trainer.dpo is not None else {}
                obs.step(step, loss, grad_norm, lr, dt, consumed, val, log_now)
                ckpt.after_step(trainer.state)
        wd.stop()  # the final save is not timed
        ckpt.close(trainer.state)
        if obs.step_times:  # a run resumed at its last step trains no step: nothing to report
            report = obs.report(cfg, layout, plan)
            if rank == 0:
                write_perf(run_dir, report)
                log.info("%s\nwritten to %s", perf_markdown(report).rstrip(), run_dir / "perf.md")
    finally:
        wd.stop()
        obs.close()
    return TrainResult(
        run_dir=run_dir,
        steps=trainer.state.step,
        losses=obs.losses if rank == 0 else [math.nan] * len(obs.losses),
        val_losses=obs.val_losses,
        perf=None if report is None else report.as_dict(),
    )


def _resolve_data_rank0_first(cfg: RootConfig, rank: int) -> Any:
    """Rank 0 resolves (and may build the demo corpus) first; the others then reuse the cache.

    A `UserError` on rank 0 is sent to every rank, so all of them stop with the same message
    instead of waiting at a barrier for a rank that has already exited.
    """
    import torch.distributed as dist

    from llmctl.errors import UserError
    from llmctl.run.data import resolve_data

    spec = None
    error: list[str | None] = [None]
    if rank == 0:
        try:
            spec = resolve_data(cfg)
        except UserError as e:
            error = [e.message]
    dist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise UserError(error[0])
    return spec if spec is not None else resolve_data(cfg)


def run_in_process(
    cfg: RootConfig, run_dir: str | Path, *, checkpointer: Checkpointer | None = None
) -> TrainResult:
    """Train with one rank inside this process (starts and stops a one-rank gloo/NCCL group).

    Args:
        cfg: The resolved `RootConfig` (its layout must have world size 1).
        run_dir: Run directory (created if missing; config.yaml written if absent).
        checkpointer: Checkpoint policy; None = no checkpoints.
    """
    import torch.distributed as dist

    from llmctl.train import cpu_compat, parallel

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    created, had_compat = not dist.is_initialized(), cpu_compat.is_installed()
    parallel.init_distributed()
    try:
        return train(cfg, run_dir, checkpointer=checkpointer)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
        if not had_compat:
            cpu_compat.uninstall()
