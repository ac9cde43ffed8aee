"""Prometheus metrics of a training run: what each rank measures, beside what the plan predicted.

Every rank process keeps its own registry (`prometheus-client`, the `train` extra) and, with
`train.metrics.port` set, serves it at `http://ADDRESS:PORT+LOCAL_RANK/metrics`; with
`train.metrics.pushgateway` set it also pushes it there every `push_interval_s` and once at the
end (batch jobs that no server scrapes). The names follow Prometheus' conventions: base units
(`_seconds`, `_bytes`, `_ratio`), `_total` for counters, and labels `run` (the run directory's
name), `rank` and `host` on every series. docs/monitoring.md lists them; the shipped alert rules
(configs/monitoring/llmctl-alerts.yml) are written against them.

Why it costs nothing measurable: the training thread only sets a dozen numbers per step (5 to 9
us against a CPU tiny step of ~60 ms; benchmarks/metrics_overhead.py); memory and the
exposition text are computed by the HTTP or push thread when asked for.

The same numbers, from metrics.jsonl, plan.json and starts.jsonl, are what `llmctl status RUN
--json` shows under "metrics" (`status_metrics`). Torch-free: torch is imported only inside the
GPU memory readers, which run only on GPU ranks.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.memory import peak_rss_bytes, rss_bytes
from llmctl.run.metrics import flops_per_token, peak_tflops_for

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan import Layout, PlanRecord

log = logging.getLogger("llmctl.train")

STARTS_FILE = "starts.jsonl"
PUSH_JOB = "llmctl"
STEP_BUCKETS_S = tuple(0.01 * 2**k for k in range(15))  # 10 ms .. 164 s
LABELS = ("run", "rank", "host")


def alert_rules_path() -> Path:
    """The shipped alert rules (configs/monitoring/llmctl-alerts.yml, checkout or wheel)."""
    from llmctl.resources import resource_dir

    return resource_dir("configs") / "monitoring" / "llmctl-alerts.yml"


# ----- starts of a run: restarts and layout changes -----
@dataclass(frozen=True, slots=True, kw_only=True)
class Starts:
    """How often a run directory's trainer started, and at how many layouts."""

    num_starts: int
    layout_changes: int

    @property
    def restarts(self) -> int:
        """Starts after the first (torchrun restarts, SLURM requeues, `llmctl resume`)."""
        return max(0, self.num_starts - 1)


def read_starts(run_dir: Path) -> Starts:
    """Count the starts recorded in RUN_DIR/starts.jsonl (a cut-short line is skipped)."""
    layouts: list[Any] = []
    path = run_dir / STARTS_FILE
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                layouts.append(json.loads(line).get("layout"))
            except (ValueError, AttributeError):
                continue
    changes = sum(1 for a, b in itertools.pairwise(layouts) if a != b)
    return Starts(num_starts=len(layouts), layout_changes=changes)


def record_start(run_dir: Path, step: int, layout: dict[str, Any]) -> Starts:
    """Append this start (rank 0, before the first step) and return the counts with it."""
    record = {"time": time.time(), "step": step, "layout": layout, "host": socket.gethostname()}
    path = run_dir / STARTS_FILE
    line = json.dumps(record, sort_keys=True) + "\n"
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write("\n" + line if _cut_short(path) else line)
    except OSError as e:  # a full disk must not stop training; the counts miss this start
        log.warning("cannot append to %s (%s)", run_dir / STARTS_FILE, e.strerror)
    return read_starts(run_dir)


def _cut_short(path: Path) -> bool:
    """Whether a file's last line lacks its newline (a crash while it was written)."""
    try:
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:  # missing or empty
        return False


# ----- the plan's predictions -----
def predictions(plan: PlanRecord | None) -> dict[str, float]:
    """The plan's predicted step seconds, tokens/s, MFU and peak memory bytes (finite ones)."""
    if plan is None:
        return {}
    out = {
        "step_seconds": plan.step_time_s,
        "tokens_per_second": plan.tokens_per_s,
        "mfu_ratio": plan.mfu,
        "memory_bytes": plan.peak_mem_gib * 2**30,
    }
    return {k: float(v) for k, v in out.items() if math.isfinite(v)}


# ----- memory, read when scraped -----
def host_rss_bytes() -> float:
    """Resident set size of this process now, bytes (`llmctl.memory`)."""
    return float(rss_bytes())


def host_peak_rss_bytes() -> float:
    """Peak resident set size of this process (VmHWM), bytes (`llmctl.memory`)."""
    return float(peak_rss_bytes())


def _gpu_readers(device: int) -> dict[str, Any]:
    """Name -> reader of this rank's GPU memory (allocator counters and the driver's view)."""

    def used() -> float:
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return float(total - free)

    def allocated() -> float:
        import torch

        return float(torch.cuda.memory_allocated(device))

    def reserved() -> float:
        import torch

        return float(torch.cuda.memory_reserved(device))

    return {"used": used, "allocated": allocated, "reserved": reserved}


def _nvml_utilization(device: int) -> Any:
    """A reader of the GPU's utilization (0..1) through NVML (`nvidia-ml-py`, the `topo`
    extra), or None when NVML or the device cannot be reached (the gauge is then absent)."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(
            uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        )
    except Exception as e:  # no NVML library, no driver, an old torch without uuid
        log.info("GPU utilization not exported (NVML: %s)", e)
        return None

    def read() -> float:
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0

    return read


# ----- the families -----
class RankMetrics:
    """The metric families of one rank process, in a registry of their own.

    Series that are always known (step, step time, loss, ...) are bound to this rank's labels
    up front; the others appear when first set (`child`): MFU only with a peak, grad norm only
    when the optimizer reports one, checkpoint series after the first commit, the plan's
    predictions on rank 0 only. A series that is absent is never read as a false 0.
    """

    def __init__(self, labels: dict[str, str], *, on_gpu_device: int | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
        from prometheus_client.process_collector import ProcessCollector

        self.labels = labels
        self.registry = reg = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=reg)  # process_cpu_seconds_total, ..._resident_memory_bytes
        self.families: dict[str, Any] = {}

        def family(kind: Any, name: str, text: str, **kw: Any) -> Any:
            self.families[name] = kind(name, text, LABELS, registry=reg, **kw)
            return self.families[name].labels(**labels)

        self.info = family(Info, "llmctl_run", "The run: recipe, layout, cluster, dtype.")
        self.step = family(Gauge, "llmctl_train_step", "Optimizer steps completed (last step).")
        self.target_steps = family(Gauge, "llmctl_train_target_steps", "train_iters of the run.")
        self.step_seconds = family(
            Histogram,
            "llmctl_train_step_seconds",
            "Wall time of one optimizer step on this rank, seconds.",
            buckets=STEP_BUCKETS_S,
        )
        self.last_step_seconds = family(
            Gauge, "llmctl_train_last_step_seconds", "Wall time of the last step, seconds."
        )
        self.last_step_time = family(
            Gauge, "llmctl_train_last_step_timestamp_seconds", "When the last step ended, Unix s."
        )
        self.tokens = family(Counter, "llmctl_train_tokens", "Tokens trained on (whole job).")
        self.tokens_per_second = family(
            Gauge, "llmctl_train_tokens_per_second", "Tokens/s of the whole job at the last step."
        )
        self.loss = family(Gauge, "llmctl_train_loss", "Training loss of the last step (or NaN).")
        self.lr = family(Gauge, "llmctl_train_learning_rate", "Learning rate of the last step.")
        family(Gauge, "llmctl_host_rss_bytes", "Resident memory of this process, bytes.")
        self.child("llmctl_host_rss_bytes").set_function(host_rss_bytes)
        family(Gauge, "llmctl_host_peak_rss_bytes", "Peak resident memory of this process, bytes.")
        self.child("llmctl_host_peak_rss_bytes").set_function(host_peak_rss_bytes)
        if on_gpu_device is not None:
            for what, reader in _gpu_readers(on_gpu_device).items():
                name = f"llmctl_gpu_memory_{what}_bytes"
                family(Gauge, name, f"GPU memory {what} on this rank's device, bytes.")
                self.child(name).set_function(reader)
        self.ckpt_blocked = family(
            Counter, "llmctl_checkpoint_blocked_seconds", "Seconds the loop was held by saves."
        )
        self.ckpt_saves = family(Counter, "llmctl_checkpoint_saves", "Checkpoint saves started.")
        self.ckpt_interval = family(
            Gauge, "llmctl_checkpoint_interval_steps", "Steps between checkpoints (0 = off)."
        )
        for kind, name, text in _lazy_families():
            self.families[name] = kind(name, text, LABELS, registry=reg)
        util = _nvml_utilization(on_gpu_device) if on_gpu_device is not None else None
        if util is not None:
            self.child("llmctl_gpu_utilization_ratio").set_function(util)

    def child(self, name: str) -> Any:
        """The series of family `name` with this rank's labels (created on first use)."""
        return self.families[name].labels(**self.labels)

    def exposition(self) -> bytes:
        """The registry in the text exposition format (what a scrape returns)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def _lazy_families() -> list[tuple[Any, str, str]]:
    from prometheus_client import Gauge

    rows = [
        ("llmctl_train_mfu_ratio", "Model FLOPs utilization at the last step (0..1)."),
        ("llmctl_train_grad_norm", "Gradient norm of the last step."),
        (
            "llmctl_train_last_step_busy_seconds",
            "Part of the last step this rank was not blocked on other ranks, seconds (CPU runs).",
        ),
        (
            "llmctl_train_last_step_compute_seconds",
            "Last step's start to its gradient reduction on this rank (forward, backward), s.",
        ),
        (
            "llmctl_train_last_step_reduce_seconds",
            "Last step's time in the gradient reduction on this rank (a fast rank waits), s.",
        ),
        (
            "llmctl_train_straggler",
            "1 while the in-run detector names this rank a straggler, else 0 (set each window).",
        ),
        ("llmctl_gpu_utilization_ratio", "GPU busy share over NVML's last sample period (0..1)."),
        ("llmctl_checkpoint_last_step", "Step of the newest committed checkpoint."),
        ("llmctl_checkpoint_last_timestamp_seconds", "When it was committed, Unix seconds."),
        ("llmctl_checkpoint_last_commit_seconds", "Start to commit of the newest save, seconds."),
        ("llmctl_run_restarts", "Starts of this run after the first (rank 0)."),
        ("llmctl_run_layout_changes", "Starts at a layout other than the previous (rank 0)."),
        ("llmctl_plan_step_seconds", "The plan's predicted step time, seconds (rank 0)."),
        ("llmctl_plan_tokens_per_second", "The plan's predicted tokens/s of the job (rank 0)."),
        ("llmctl_plan_mfu_ratio", "The plan's predicted model FLOPs utilization (rank 0)."),
        ("llmctl_plan_memory_bytes", "The plan's predicted peak memory per device (rank 0)."),
    ]
    return [(Gauge, name, text) for name, text in rows]


# ----- a rank's exporter -----
class RankExporter:
    """Feeds `RankMetrics` from the loop's per-step record; serves and pushes it."""

    def __init__(
        self,
        cfg: RootConfig,
        run_dir: Path,
        layout: Layout,
        *,
        rank: int,
        on_gpu: bool,
        plan: PlanRecord | None,
        ckpt: Any,
    ) -> None:
        mc = cfg.train.metrics
        self.run_dir = run_dir
        labels = {"run": run_dir.name, "rank": str(rank), "host": socket.gethostname()}
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.m = RankMetrics(labels, on_gpu_device=local_rank if on_gpu else None)
        self.tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_length
        self.flops_per_device_step = (
            flops_per_token(cfg.model) * self.tokens_per_step / max(1, layout.world_size)
        )
        from llmctl.config.values import enum_value

        self.peak_flops = (
            peak_tflops_for(cfg.cluster, enum_value(cfg.precision.dtype)) or 0
        ) * 1e12
        self.ckpt = ckpt
        self.rank = rank
        self.on_gpu = on_gpu
        self._bound: dict[str, Any] = {}
        self._seen_saves = 0
        self._seen_ckpt: int | None = None
        self.m.target_steps.set(cfg.train.train_iters)
        self.m.ckpt_interval.set(cfg.checkpoint.interval)
        self.m.info.info(
            {
                "recipe": str(cfg.recipe or ""),
                "layout": plan.layout_name if plan is not None else "",
                "cluster": str(cfg.cluster.name),
                "dtype": enum_value(cfg.precision.dtype),
            }
        )
        if rank == 0:
            for key, value in predictions(plan).items():
                self.m.child(f"llmctl_plan_{key}").set(value)
        self.mfu = self.m.child("llmctl_train_mfu_ratio") if self.peak_flops else None
        self.server: Any = None
        self.port = mc.port + local_rank if mc.port else None
        self.push = (
            _Pusher(mc.pushgateway, mc.push_interval_s, self.m, labels) if mc.pushgateway else None
        )

    def set_starts(self, starts: Starts) -> None:
        """Rank 0: the restarts and layout changes recorded in starts.jsonl."""
        self.m.child("llmctl_run_restarts").set(starts.restarts)
        self.m.child("llmctl_run_layout_changes").set(starts.layout_changes)

    def start(self, address: str) -> None:
        """Serve /metrics on this rank's port (a port in use is logged, not fatal) and start
        pushing."""
        if self.port is not None:
            from prometheus_client import start_http_server

            try:
                self.server, _ = start_http_server(
                    self.port, addr=address, registry=self.m.registry
                )
                log.info("Prometheus metrics at http://%s:%d/metrics", address, self.port)
            except OSError as e:
                log.error("cannot serve metrics on %s:%d (%s); not served", address, self.port, e)
        if self.push is not None:
            self.push.start()

    def step(
        self,
        step: int,
        loss: float,
        grad_norm: float | None,
        lr: float,
        dt: float,
        rank_cpu: list[list[float]] | None = None,
    ) -> None:
        """Record one optimizer step (every rank, every step: the numbers are set, not sent).

        `rank_cpu` is the step's `StepMetrics.rank_cpu` (CPU runs): this rank's row gives the
        part of the step it was not blocked on others, the figure that tells a straggler (the
        wall step time is the same on every rank of a synchronous job)."""
        m = self.m
        m.step.set(step)
        m.step_seconds.observe(dt)
        m.last_step_seconds.set(dt)
        m.last_step_time.set(time.time())
        m.tokens.inc(self.tokens_per_step)
        m.tokens_per_second.set(self.tokens_per_step / dt)
        if self.mfu is not None:
            self.mfu.set(self.flops_per_device_step / dt / self.peak_flops)
        m.loss.set(loss)
        if grad_norm is not None:
            self._lazy("llmctl_train_grad_norm").set(grad_norm)
        if rank_cpu is not None and len(rank_cpu) > self.rank:
            busy = self._lazy("llmctl_train_last_step_busy_seconds")
            busy.set(max(0.0, dt - rank_cpu[self.rank][1]))
        m.lr.set(lr)
        self._checkpoint()

    def step_parts(self, compute_s: float, reduce_s: float) -> None:
        """The last step's compute and reduce parts (`llmctl.train.straggler`). On GPU ranks,
        where schedstat says nothing about the device, the compute part is also the busy
        seconds that the shipped straggler rule compares."""
        self._lazy("llmctl_train_last_step_compute_seconds").set(compute_s)
        self._lazy("llmctl_train_last_step_reduce_seconds").set(reduce_s)
        if self.on_gpu:
            self._lazy("llmctl_train_last_step_busy_seconds").set(compute_s)

    def straggler(self, named: bool) -> None:
        """Each window: whether the detector names this rank a straggler now. Every rank sets
        its own series (a Pushgateway refuses a push whose series' `rank` differs from the
        push's grouping key)."""
        self._lazy("llmctl_train_straggler").set(1 if named else 0)

    def _lazy(self, name: str) -> Any:
        """The series of a family set only sometimes, bound on first use."""
        child = self._bound.get(name)
        if child is None:
            child = self._bound[name] = self.m.child(name)
        return child

    def _checkpoint(self) -> None:
        """New saves and commits of the checkpointer (DistCheckpointer's attributes)."""
        blocked = getattr(self.ckpt, "blocked_s", None)
        if blocked and len(blocked) > self._seen_saves:
            self.m.ckpt_blocked.inc(sum(blocked[self._seen_saves :]))
            self.m.ckpt_saves.inc(len(blocked) - self._seen_saves)
            self._seen_saves = len(blocked)
        last = getattr(self.ckpt, "last_saved", None)
        if last is not None and last != self._seen_ckpt:
            self._seen_ckpt = last
            self.m.child("llmctl_checkpoint_last_step").set(last)
            committed = _committed_at(self.run_dir, last)
            self.m.child("llmctl_checkpoint_last_timestamp_seconds").set(committed)
            commits = getattr(self.ckpt, "commit_s", None)
            if commits:
                self.m.child("llmctl_checkpoint_last_commit_seconds").set(commits[-1])

    def close(self) -> None:
        """Catch up with the final checkpoint, push once more, stop serving."""
        self._checkpoint()
        if self.push is not None:
            self.push.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def _committed_at(run_dir: Path, step: int) -> float:
    """When checkpoint `step` was committed: its directory's mtime (set by the atomic rename)."""
    from llmctl.run.ckpt_store import iter_name

    try:
        return (run_dir / "checkpoints" / iter_name(step)).stat().st_mtime
    except OSError:
        return time.time()


class _Pusher:
    """Pushes a registry to a Pushgateway every interval (own thread) and once at `stop`."""

    def __init__(self, url: str, interval_s: float, m: RankMetrics, labels: dict[str, str]):
        self.url, self.interval_s, self.m = url, interval_s, m
        self.key = {"run": labels["run"], "rank": labels["rank"]}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="llmctl-metrics-push", daemon=True)
        self.failing = False

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(self.interval_s):
            self.push_now()

    def push_now(self) -> bool:
        """One push; the first failure of a streak is logged. Returns whether it went through."""
        from prometheus_client import push_to_gateway

        try:
            push_to_gateway(self.url, PUSH_JOB, self.m.registry, grouping_key=self.key, timeout=5)
        except OSError as e:
            if not self.failing:
                log.warning("cannot push metrics to %s (%s); retrying each interval", self.url, e)
            self.failing = True
            return False
        if self.failing:
            log.info("metrics pushed to %s again", self.url)
        self.failing = False
        return True

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        self.push_now()


def start_metrics(
    cfg: RootConfig,
    run_dir: Path,
    layout: Layout,
    *,
    rank: int,
    on_gpu: bool,
    plan: PlanRecord | None,
    ckpt: Any,
    start_step: int,
) -> RankExporter | None:
    """Record this start (rank 0) and, when `train.metrics` asks for it, start the exporter.

    Returns:
        The rank's exporter, or None when neither a port nor a Pushgateway is configured.
    """
    starts = record_start(run_dir, start_step, layout.as_dict()) if rank == 0 else None
    mc = cfg.train.metrics
    if not mc.port and not mc.pushgateway:
        return None
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        from llmctl.errors import UserError

        raise UserError(
            "train.metrics needs prometheus-client: pip install 'llmctl[train]'"
        ) from None
    exporter = RankExporter(cfg, run_dir, layout, rank=rank, on_gpu=on_gpu, plan=plan, ckpt=ckpt)
    if starts is not None:
        exporter.set_starts(starts)
    exporter.start(mc.address)
    return exporter


# ----- the same numbers for `llmctl status --json` -----
def status_metrics(run_dir: Path) -> dict[str, float | None]:
    """The exporter's numbers for a run directory, from its files (rank 0's view): the last
    metrics.jsonl record, plan.json and starts.jsonl, keyed by the Prometheus names."""
    from llmctl.run.rundir import METRICS_FILE, read_plan

    rec = _last_record(run_dir / METRICS_FILE)
    starts = read_starts(run_dir)
    out: dict[str, float | None] = {
        "llmctl_train_step": rec.get("step"),
        "llmctl_train_last_step_seconds": rec.get("step_time_s"),
        "llmctl_train_last_step_timestamp_seconds": rec.get("time"),
        "llmctl_train_tokens_per_second": rec.get("tokens_per_s"),
        "llmctl_train_mfu_ratio": rec.get("mfu"),
        "llmctl_train_loss": rec.get("loss"),
        "llmctl_train_grad_norm": rec.get("grad_norm"),
        "llmctl_train_learning_rate": rec.get("lr"),
        "llmctl_run_restarts": starts.restarts if starts.num_starts else None,
        "llmctl_run_layout_changes": starts.layout_changes if starts.num_starts else None,
    }
    try:
        plan = read_plan(run_dir)
    except (ValueError, UserError):  # plan.json cut short: no predictions
        plan = None
    out.update({f"llmctl_plan_{k}": v for k, v in predictions(plan).items()})
    return out


def _last_record(path: Path) -> dict[str, Any]:
    """The last whole JSON record of a metrics.jsonl ({} when none)."""
    if not path.is_file():
        return {}
    for line in reversed(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            return rec
    return {}
