"""Straggler detection inside the run: each rank times its steps' parts; rank 0 judges.

Each step is split at the entry of megatron-core's gradient reduction
(`config.finalize_model_grads_func`, wrapped here): *compute* = step start to that point,
*reduce* = time inside it (a fast rank waits there for the slow one). On CPU the marks are
`time.perf_counter()`; on GPU they are CUDA events on the compute stream, read after the step's
synchronize, so they time the device's forward and backward, not the host's kernel launches.
Every `train.straggler.window_steps` steps each rank's window figures, host and node are
gathered on every rank (`all_gather_object`, one small collective per window); every rank feeds
them to its own `llmctl.run.straggler.StragglerDetector` (deterministic: all reach the same
verdict), so each exports whether it is named itself; rank 0 writes the log line and the files
(the logic and why compute time: docs/monitoring.md, Stragglers).

Cost per step: four clock reads (or CUDA event records) and two list appends.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value
from llmctl.run.straggler import (
    RankWindow,
    StragglerDetector,
    StragglerLog,
    Verdict,
    record_excluded_host,
    window_figure,
)

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train")


class StepParts:
    """Marks of one rank's steps: start, gradient reduction entered and left."""

    def __init__(self, model_config: Any, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        self.t0 = self.t_in = self.t_out = 0.0
        self.ev: list[Any] = []
        if on_gpu:
            import torch

            self.ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]  # type: ignore[no-untyped-call]
        inner = model_config.finalize_model_grads_func
        if inner is not None:

            def finalize(*args: Any, **kwargs: Any) -> Any:
                self._mark(1)
                try:
                    return inner(*args, **kwargs)
                finally:
                    self._mark(2)

            model_config.finalize_model_grads_func = finalize
        self.reached = False

    def _mark(self, i: int) -> None:
        if self.on_gpu:
            self.ev[i].record()
        now = time.perf_counter()
        if i == 0:
            self.t0, self.reached = now, False
        elif i == 1:
            self.t_in, self.reached = now, True
        else:
            self.t_out = now

    def begin(self) -> None:
        """The step starts."""
        self._mark(0)

    def parts(self, step_s: float) -> tuple[float, float]:
        """(compute s, reduce s) of the step just ended (after the device synchronize)."""
        if not self.reached:  # no gradient reduction this step: all of it is compute
            return step_s, 0.0
        if self.on_gpu:
            return self.ev[0].elapsed_time(self.ev[1]) / 1e3, self.ev[1].elapsed_time(
                self.ev[2]
            ) / 1e3
        return self.t_in - self.t0, self.t_out - self.t_in


class StragglerWatch:
    """One rank's part: time every step, gather every window, and on rank 0 judge and report."""

    def __init__(
        self,
        cfg: RootConfig,
        run_dir: Path,
        model_config: Any,
        *,
        rank: int,
        on_gpu: bool,
        prom: Any = None,
    ) -> None:
        from megatron.core import parallel_state as ps

        sc = cfg.train.straggler
        self.window = sc.window_steps
        self.rank, self.run_dir = rank, run_dir
        self.exclude = enum_value(sc.policy) == "exclude"
        self.parts = StepParts(model_config, on_gpu)
        self.compute: list[float] = []
        self.reduce: list[float] = []
        self.steps: list[float] = []
        self.host = socket.gethostname()
        self.group = ps.get_pipeline_model_parallel_rank()
        node = os.environ.get("GROUP_RANK")
        self.node_rank = int(node) if node and node.isdigit() else None
        self.prom: Any = prom
        self.detector = StragglerDetector(margin=sc.margin, windows=sc.windows)
        settings = {
            "window_steps": sc.window_steps, "margin": sc.margin, "windows": sc.windows,
            "policy": enum_value(sc.policy),
        }  # fmt: skip
        self.log = StragglerLog(run_dir, settings) if rank == 0 else None

    def begin(self) -> None:
        """Before the step."""
        self.parts.begin()

    def end(self, step: int, step_s: float) -> None:
        """After the step (and its synchronize); gathers at the end of each window."""
        compute, reduce = self.parts.parts(step_s)
        self.compute.append(compute)
        self.reduce.append(reduce)
        self.steps.append(step_s)
        if self.prom is not None:
            self.prom.step_parts(compute, reduce)
        if len(self.steps) >= self.window:
            self._window(step)

    def _window(self, step: int) -> None:
        import torch.distributed as dist

        mine = RankWindow(
            rank=self.rank, host=self.host, group=self.group,
            compute_s=window_figure(self.compute), reduce_s=statistics.median(self.reduce),
            step_s=statistics.median(self.steps), node_rank=self.node_rank,
        )  # fmt: skip
        self.compute.clear()
        self.reduce.clear()
        self.steps.clear()
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        ranks = [g for g in gathered if isinstance(g, RankWindow)]
        verdict = self.detector.observe(step, ranks, first_step=step - self.window + 1)
        if self.prom is not None:  # every rank judges the same windows alike: its own series
            self.prom.straggler(self.rank in self.detector.current)
        if self.log is not None:
            self._report(step, ranks, verdict)

    def _report(self, step: int, ranks: list[RankWindow], verdict: Verdict) -> None:
        for s in verdict.named:
            log.warning("%s", s.line(self.window))
            if self.exclude:
                record_excluded_host(self.run_dir, s, step)
                log.warning(
                    "straggler policy exclude: host %s recorded in %s; the next launch skips it",
                    s.host,
                    self.run_dir / "excluded_hosts.json",
                )
        for s in verdict.cleared:
            log.warning(
                "straggler cleared: rank %d on host %s is within the margin again", s.rank, s.host
            )
        try:
            if self.log is not None:
                self.log.write(step, ranks, verdict, self.detector)
        except OSError as e:  # a full disk: the verdict is in the log and the metrics
            log.error("cannot write %s (%s)", self.run_dir / "stragglers.json", e)


class _Off:
    """The watch when detection is off: nothing timed, nothing gathered."""

    def begin(self) -> None:
        """Nothing."""

    def end(self, step: int, step_s: float) -> None:
        """Nothing."""
        del step, step_s


def start_watch(
    cfg: RootConfig, run_dir: Path, model_config: Any, *, rank: int, on_gpu: bool, prom: Any
) -> StragglerWatch | _Off:
    """The rank's watch (`prom`: its exporter or None); off with `train.straggler.window_steps=0`
    or a single rank (nobody to compare with)."""
    import torch.distributed as dist

    if cfg.train.straggler.window_steps <= 0 or dist.get_world_size() < 2:
        return _Off()
    return StragglerWatch(cfg, run_dir, model_config, rank=rank, on_gpu=on_gpu, prom=prom)
