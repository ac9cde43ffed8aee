"""Throughput, FLOPs and MFU accounting, the metrics JSONL file and the perf report.

Why these formulas: model FLOPs per token are the planner's (`llmctl.plan.flops.token_flops`)
with the non-causal attention convention used by most MFU reports (PaLM, Megatron-LM's
reporting): `6 * N_matmul + 12 * L * s * d_attn` for a training step (forward 2 FLOPs per
multiply-add, backward twice the forward), where `N_matmul` counts the weights every token
multiplies through (attention projections, MLP, and the logits layer; not the embedding lookup)
and the second term is attention scores and values over the full sequence (causal masking is
not discounted). Recomputation is not counted: MFU measures useful work.
MFU = achieved model FLOP/s per device / the device's dense peak for the compute dtype
(`cluster.peak_tflops`). Pure Python (no torch) so it is unit-tested directly.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.config.values import enum_value as _v

if TYPE_CHECKING:
    from llmctl.config.schema import ClusterConfig, ModelConfig, RootConfig

WANDB_ID_FILE = "wandb_run_id"


def flops_per_token(model: ModelConfig) -> float:
    """Training model FLOPs per token (the planner's, non-causal; see the module docstring)."""
    from llmctl.plan.flops import token_flops
    from llmctl.run.planning import model_shape

    return token_flops(model_shape(model), causal=False).total


def sched_ns() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for a CPU) of the calling thread, from
    /proc/thread-self/schedstat; None where the kernel does not report it.

    Only the calling (training) thread: helper threads that wake often add waits that say
    nothing about the step."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def rank_times(
    wall_s: float, before: tuple[int, int] | None, after: tuple[int, int] | None
) -> tuple[float, float, float] | None:
    """(seconds on a CPU, seconds blocked on others, CPU share) of this rank's training thread
    over one step from two `sched_ns` readings: the rest of the wall time that was neither
    running nor waiting for a CPU was spent blocked (on other ranks, I/O)."""
    if before is None or after is None:
        return None
    run, wait = (after[0] - before[0]) / 1e9, (after[1] - before[1]) / 1e9
    if run <= 0 or wait < 0:
        return None
    return run, max(0.0, wall_s - run - wait), run / (run + wait)


def cpu_share(wall_s: float, ranks: list[tuple[float, float, float]]) -> float | None:
    """Load-corrected step time / wall step time, from every rank's `rank_times`.

    Why: on a shared host a step stretches by the time ranks waited for a CPU. The step
    without those waits is that of the rank that computes the most (the bottleneck: the most
    CPU seconds): its CPU seconds plus its blocked seconds shrunk by the lowest CPU share of
    the other ranks (the work it waited for was stretched alike). One rank: its CPU seconds.
    On an idle host the share is 1. Not the longest of every rank's such step: a rank that
    mostly waits for the bottleneck carries the bottleneck's whole stretch in its blocked
    seconds, and on a loaded 2-core host that over-corrected PP=2 and DP=2 steps by up to
    25 % (docs/planner.md, Calibration).
    """
    if not ranks or wall_s <= 0:
        return None
    i = max(range(len(ranks)), key=lambda k: ranks[k][0])
    run, blocked, _ = ranks[i]
    others = [share for j, (_, _, share) in enumerate(ranks) if j != i]
    return min(1.0, (run + blocked * (min(others) if others else 1.0)) / wall_s)


def peak_tflops_for(cluster: ClusterConfig, dtype: str) -> float | None:
    """Dense peak TFLOP/s of one device for a compute dtype (fp8 falls back to bf16)."""
    peaks = dict(cluster.peak_tflops or {})
    for key in (dtype, "bf16" if dtype == "fp8" else dtype, "tf32" if dtype == "fp32" else dtype):
        if peaks.get(key):
            return float(peaks[key])
    return None


@dataclass(slots=True)
class StepMetrics:
    """One logged step."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    mfu: float | None
    mem_gib: float | None
    consumed_samples: int
    val_loss: float | None = None
    cpu_share: float | None = None
    """Load-corrected / wall step time (`cpu_share`, from Linux schedstat; 1.0 on an otherwise
    idle host): `step_time_s * cpu_share` is the step time with the ranks' waits for a CPU
    taken out, the figure `plan --calibrate` fits."""
    rank_cpu: list[list[float]] | None = None
    """Per rank, its training thread's (seconds on a CPU, seconds blocked on other ranks,
    CPU share) of this step (`rank_times`; CPU runs only): what `cpu_share` is made of."""
    time: float = field(default_factory=time.time)


SUPERSEDED_METRICS = "metrics.superseded.jsonl"


class MetricsLog:
    """Appends one JSON object per line to RUN_DIR/metrics.jsonl (rank 0 only)."""

    def __init__(self, path: Path, *, start_step: int = 0) -> None:
        """Open `path` for appending after step `start_step` (the step the run resumed at).

        Records of later steps, written by a run that died after its newest checkpoint, and a
        line cut short by the crash, are moved to metrics.superseded.jsonl first, so that
        metrics.jsonl holds every step once, in order, as the resumed run trained it.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():
            _drop_lost_steps(path, start_step)
        self._f: TextIO = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Write and flush one record (NaN/inf become null)."""
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()
        }
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file."""
        self._f.close()


def _step_of(line: str) -> int | None:
    """The step of one whole (newline-terminated) metrics record, else None."""
    if not line.endswith("\n"):
        return None
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _drop_lost_steps(path: Path, start_step: int) -> None:
    """Move records after `start_step` and unterminated lines from `path` to the superseded
    file (appended), rewriting `path` atomically; a no-op when there are none."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    keep: list[str] = []
    lost: list[str] = []
    for line in lines:
        step = _step_of(line)
        (keep if step is not None and step <= start_step else lost).append(line)
    if not lost:
        return
    with (path.parent / SUPERSEDED_METRICS).open("a", encoding="utf-8") as f:
        f.writelines(x if x.endswith("\n") else x + "\n" for x in lost)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(keep), encoding="utf-8")
    os.replace(tmp, path)
    logging.getLogger(__name__).info(
        "metrics.jsonl: %d record(s) after step %d (from before the resume) moved to %s",
        len(lost),
        start_step,
        SUPERSEDED_METRICS,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PerfReport:
    """Predicted (plan) versus measured performance of a run."""

    cluster: str
    layout: dict[str, Any]
    dtype: str
    num_devices: int
    predicted_step_s: float | None
    measured_step_s: float
    predicted_peak_mem_gib: float | None
    measured_peak_mem_gib: float | None
    tokens_per_s: float
    predicted_tokens_per_s: float | None
    tflops_per_device: float
    mfu: float | None
    steps_measured: int
    load_corrected_step_s: float | None = None
    """CPU runs: the step time with the ranks' waits for a CPU taken out (`quiet_step_s` of
    `step_time_s * cpu_share`), what `plan --calibrate` fits; None where not recorded."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _ratio(pred: float | None, meas: float | None) -> str:
    if pred is None or meas is None or meas == 0:
        return "n/a"
    return f"{pred / meas:.2f}"


def perf_markdown(r: PerfReport) -> str:
    """The predicted-vs-measured table as Markdown (RUN_DIR/perf.md)."""

    def fmt(x: float | None, spec: str = ".4g") -> str:
        return "n/a" if x is None else format(x, spec)

    rows = [
        ("step time (s)", r.predicted_step_s, r.measured_step_s),
        *(
            [("step time, load-corrected (s)", r.predicted_step_s, r.load_corrected_step_s)]
            if r.load_corrected_step_s is not None
            else []
        ),
        ("tokens/s", r.predicted_tokens_per_s, r.tokens_per_s),
        ("peak memory (GiB)", r.predicted_peak_mem_gib, r.measured_peak_mem_gib),
    ]
    layout = " ".join(f"{k}={v}" for k, v in r.layout.items() if v is not None)
    lines = [
        f"# Predicted vs measured: {r.cluster}, {r.dtype}, {r.num_devices} device(s)",
        "",
        f"Layout: {layout}",
        "",
        "| metric | predicted | measured | predicted/measured |",
        "|---|---|---|---|",
        *(f"| {n} | {fmt(p)} | {fmt(m)} | {_ratio(p, m)} |" for n, p, m in rows),
        "",
        f"TFLOP/s per device: {r.tflops_per_device:.4g}; MFU: {fmt(r.mfu, '.2%')}; "
        f"steady-state steps measured: {r.steps_measured}",
        "",
    ]
    return "\n".join(lines)


def write_perf(run_dir: Path, report: PerfReport) -> None:
    """Write RUN_DIR/perf.json and RUN_DIR/perf.md."""
    (run_dir / "perf.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    (run_dir / "perf.md").write_text(perf_markdown(report))


def steady_state_step_s(step_times_s: list[float]) -> float:
    """Median step time after dropping the first steps (warm-up, allocator, caches)."""
    if not step_times_s:
        return float("nan")
    skip = min(len(step_times_s) // 5 + 1, len(step_times_s) - 1) if len(step_times_s) > 1 else 0
    times = sorted(step_times_s[skip:])
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])


def quiet_step_s(step_times_s: list[float]) -> float | None:
    """The 20th percentile of the steady-state steps (the first fifth and one more dropped):
    on a shared host the steps least disturbed by others; None with fewer than 3 left."""
    steady = sorted(step_times_s[len(step_times_s) // 5 + 1 :])
    return steady[len(steady) // 5] if len(steady) >= 3 else None


def wandb_state(cfg: RootConfig) -> str | None:
    """Why W&B tracking is off (one sentence), or None when it will run."""
    if os.environ.get("LLMCTL_WANDB", "auto") == "off":
        return "W&B tracking off (LLMCTL_WANDB=off); metrics in metrics.jsonl only"
    if _v(cfg.train.wandb.mode) == "disabled":
        return "W&B tracking off (train.wandb.mode=disabled); metrics in metrics.jsonl only"
    try:
        import wandb  # noqa: F401
    except ImportError:
        return (
            "W&B tracking off: wandb is not installed (pip install 'llmctl[track]'); "
            "metrics in metrics.jsonl only"
        )
    return None


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of this llmctl run: made once, kept in RUN_DIR/wandb_run_id, so every
    resume continues the same W&B run."""
    path = run_dir / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    import secrets
    import string

    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(run_id + "\n")
    tmp.replace(path)
    return run_id


def start_wandb(cfg: RootConfig, run_dir: Path, log: logging.Logger) -> Any:
    """Start (or continue, after a resume) the W&B run of `run_dir`; None when off, said in
    one log line either way."""
    off = wandb_state(cfg)
    if off is not None:
        log.info(off)
        return None
    import wandb
    import yaml

    from llmctl.config import cfg_to_yaml

    w = cfg.train.wandb
    run_id = wandb_run_id(run_dir)
    run = wandb.init(
        project=w.project,
        entity=w.entity,
        tags=list(w.tags) or None,
        id=run_id,
        resume="allow",
        name=run_dir.name,
        dir=str(run_dir),
        mode=_v(w.mode),  # type: ignore[arg-type]
        config=yaml.safe_load(cfg_to_yaml(cfg)),
        settings=wandb.Settings(silent=not os.environ.get("LLMCTL_VERBOSE")),  # our line below
    )
    log.info("W&B run %s (%s) in %s/wandb", run_id, _v(w.mode), run_dir)
    return run
