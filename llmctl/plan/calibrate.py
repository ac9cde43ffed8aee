"""Calibration: fit a cluster's step-time knobs to measured runs.

Why this way: the step-time model is a sum of physically named terms whose rates are the
cluster's knobs (`achievable_fraction`, `Efficiency`). Given runs measured on the cluster (the
layout, the inputs and the measured seconds per step), the knobs are refitted by coordinate
descent on the mean |log(predicted / measured)|, so the model keeps its structure (how time
moves with TP, PP, DP, micro-batch) and only its rates change. One run determines one number:
with fewer than three runs only `scale` is fitted (the host is uniformly faster or slower than
assumed: compute rates divided, fixed overheads multiplied); with three or more the overhead
knobs are fitted as well. The same routine fits the shipped clusters on published runs
(benchmarks/plan_fit.py).

`calibrate` (memory) rescales the fragmentation fraction from measured peak memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmctl.plan.layout import Layout
from llmctl.plan.search import evaluate
from llmctl.plan.specs import ClusterSpec, PlanInput

#: A knob and its search range: "scale", "fraction.<dtype>" or an `Efficiency` field.
Knob = tuple[str, float, float]
SCALE: Knob = ("scale", 0.05, 20.0)
OVERHEAD_KNOBS: tuple[Knob, ...] = (
    ("layer_overhead_us", 0.0, 20000.0),
    ("chunk_overhead_us", 0.0, 50000.0),
    ("step_overhead_s", 0.0, 2.0),
)
_SCALED = (
    "layer_overhead_us",
    "chunk_overhead_us",
    "step_overhead_s",
    "elementwise_passes",
    "p2p_latency_us",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRun:
    """One finished run: its planner input, its layout and its measured seconds per step."""

    input: PlanInput
    layout: Layout
    step_s: float

    def __post_init__(self) -> None:
        if self.step_s <= 0:
            raise ValueError(f"measured step time must be > 0, got {self.step_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PerfRecord:
    """One training run's predicted and measured figures (the run's perf.json)."""

    cluster: str
    dtype: str
    predicted_step_s: float
    measured_step_s: float
    predicted_peak_mem_gib: float
    measured_peak_mem_gib: float | None = None

    def __post_init__(self) -> None:
        if self.predicted_step_s <= 0 or self.measured_step_s <= 0:
            raise ValueError("perf record step times must be > 0")


def with_knob(cluster: ClusterSpec, knob: str, value: float) -> ClusterSpec:
    """`cluster` with one knob set (`scale` multiplies the current overheads by `value` and
    divides the compute rates by it)."""
    if knob == "scale":
        eff = cluster.efficiency
        scaled = {k: getattr(eff, k) * value for k in _SCALED}
        fractions = {d: f / value for d, f in cluster.achievable_fraction.items()}
        eff = replace(eff, attention=min(1.0, eff.attention / value), **scaled)
        return replace(cluster, achievable_fraction=fractions, efficiency=eff)
    if knob.startswith("fraction."):
        fractions = dict(cluster.achievable_fraction)
        fractions[knob.split(".", 1)[1]] = value
        return replace(cluster, achievable_fraction=fractions)
    return replace(cluster, efficiency=replace(cluster.efficiency, **{knob: value}))


def errors(cluster: ClusterSpec, runs: Sequence[MeasuredRun]) -> list[float]:
    """predicted / measured - 1 of each run's step time on `cluster`."""
    out = []
    for run in runs:
        sized = replace(
            cluster,
            num_nodes=run.input.cluster.num_nodes,
            gpus_per_node=run.input.cluster.gpus_per_node,
        )
        pred = evaluate(replace(run.input, cluster=sized), run.layout).rates.step_s
        out.append(pred / run.step_s - 1.0)
    return out


def loss(cluster: ClusterSpec, runs: Sequence[MeasuredRun]) -> float:
    """Mean |log(predicted / measured)| over `runs`."""
    errs = errors(cluster, runs)
    return sum(abs(math.log1p(e)) for e in errs) / len(errs)


def _grid(name: str, lo: float, hi: float) -> list[float]:
    """41 points over [lo, hi] (81 on a log scale for `scale`)."""
    if name == "scale":
        return [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / 80) for i in range(81)]
    return [lo + (hi - lo) * i / 40 for i in range(41)]


def _best(cluster: ClusterSpec, runs: Sequence[MeasuredRun], knob: Knob) -> float:
    """The knob's best value: the grid's, then twice a 41-point grid over the neighbouring
    grid steps (the coarse grid alone left `scale` up to 3.9 % off a one-run calibration)."""
    name, lo, hi = knob
    grid = _grid(name, lo, hi)
    for _ in range(3):
        best = min(grid, key=lambda v: loss(with_knob(cluster, name, v), runs))
        i = grid.index(best)
        a, b = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
        grid = [a + (b - a) * k / 40 for k in range(41)]
    return best


def fit_knobs(
    cluster: ClusterSpec, runs: Sequence[MeasuredRun], knobs: Sequence[Knob], rounds: int = 6
) -> ClusterSpec:
    """Coordinate descent over `knobs` (each on a 41-point grid in its range, `scale` on a
    log grid around 1, refined around the best point), starting from the cluster's current
    values."""
    for _ in range(rounds):
        for knob in knobs:
            name = knob[0]
            best = _best(cluster, runs, knob)
            if name == "scale" or loss(with_knob(cluster, name, best), runs) < loss(cluster, runs):
                cluster = with_knob(cluster, name, best)
        if len(knobs) == 1:
            break
    return cluster


def calibrate_time(cluster: ClusterSpec, runs: Sequence[MeasuredRun]) -> ClusterSpec:
    """Cluster with its step-time knobs fitted to `runs` (see the module docstring)."""
    if not runs:
        return cluster
    knobs: list[Knob] = [SCALE]
    if len(runs) >= 3:
        knobs += OVERHEAD_KNOBS
    return fit_knobs(cluster, runs, knobs)


def calibrate(cluster: ClusterSpec, records: list[PerfRecord]) -> ClusterSpec:
    """Cluster with the fragmentation fraction rescaled by the measured peak memory of
    `records` of this cluster (others are ignored)."""
    mem = [r for r in records if r.cluster == cluster.name and r.measured_peak_mem_gib]
    if not mem:
        return cluster
    ratio = sum((r.measured_peak_mem_gib or 0.0) / r.predicted_peak_mem_gib for r in mem)
    frag = max(0.0, (1.0 + cluster.fragmentation_fraction) * ratio / len(mem) - 1.0)
    return replace(cluster, fragmentation_fraction=frag)
