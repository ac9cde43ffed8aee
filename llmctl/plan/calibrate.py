"""Calibration: rescale a cluster's achievable fraction (and overhead) from measured runs.

Why so simple: the step-time model is dominated by GEMM time at `achievable_fraction` of the
peak, so one multiplicative correction per dtype, the mean of predicted/measured step-time
ratios of runs on that cluster, absorbs most of what the model misses on a given machine.
When a run measured its peak memory, the fragmentation fraction is rescaled so the predicted
total matches the measured one on average. Records of other clusters are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmctl.plan.specs import ClusterSpec


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


def calibrate(cluster: ClusterSpec, records: list[PerfRecord]) -> ClusterSpec:
    """Cluster with achievable fractions (per dtype) and fragmentation rescaled by `records`."""
    mine = [r for r in records if r.cluster == cluster.name]
    fractions = dict(cluster.achievable_fraction)
    for dtype in {r.dtype for r in mine}:
        ratios = [r.predicted_step_s / r.measured_step_s for r in mine if r.dtype == dtype]
        base = fractions.get(dtype, 1.0)
        fractions[dtype] = min(1.0, base * sum(ratios) / len(ratios))
    frag = cluster.fragmentation_fraction
    mem = [r for r in mine if r.measured_peak_mem_gib]
    if mem:
        ratio = sum((r.measured_peak_mem_gib or 0.0) / r.predicted_peak_mem_gib for r in mem)
        frag = max(0.0, (1.0 + frag) * ratio / len(mem) - 1.0)
    return replace(cluster, achievable_fraction=fractions, fragmentation_fraction=frag)
