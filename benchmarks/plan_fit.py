"""Fit a cluster's step-time knobs on the fit rows of tests/fixtures/plan/published_runs.json.

Usage: python benchmarks/plan_fit.py dgx_h100 [--json]
Prints the fitted `achievable_fraction` and `efficiency` (paste into configs/cluster/NAME.yaml)
and the error on fit and held-out rows. On A100 the per-layer times of Korthikanti et al. 2022
Table 4 (tests/fixtures/plan/korthikanti_2022.json) are fitted too. Held-out rows are never
used by the fit. The fit is a deterministic coordinate descent on the mean
|log(predicted / measured)| step time, each knob bounded to a physically meaningful range.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmctl.config import compose
from llmctl.plan import ClusterSpec, evaluate
from llmctl.plan.reference import layer_row_s, measured_step_s, row_input, row_layout
from llmctl.run.planning import cluster_spec

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "plan" / "published_runs.json"
#: Blackwell rows (DGX B200, GB200 NVL72): same row format, models from FIX.
BLACKWELL = FIX.with_name("published_runs_blackwell.json")
#: Korthikanti et al. 2022: Table 4 (per-layer times of the 22B model) joins the A100 fit.
KORTHIKANTI = FIX.with_name("korthikanti_2022.json")
#: Knobs fixed before fitting, with why. 2022 Megatron-LM (the A100 rows) had no tensor-parallel
#: overlap beyond the asynchronous backward collectives the model schedules explicitly,
#: waited on every pipeline send/receive (no `overlap_p2p_comm` before 2023) and split non-SP
#: pipeline activations over the TP ranks (`scatter_gather_tensors_in_pipeline`).
FIXED = {"dgx_a100_80gb": {"tp_overlap": 0.0, "p2p_overlap": 0.0, "p2p_scatter_gather": 1.0}}
#: (knob, low, high); "fraction.<dtype>" is an achievable fraction, others Efficiency fields.
KNOBS = {
    "dgx_a100_80gb": [
        ("fraction.bf16", 0.4, 0.95),
        ("elementwise_passes", 2.0, 24.0),
        ("layer_overhead_us", 0.0, 500.0),
        ("step_overhead_s", 0.0, 0.3),
    ],
    "dgx_h100": [
        ("fraction.fp8", 0.25, 0.9),
        ("attention", 0.2, 0.9),
        ("tp_overlap", 0.0, 0.75),
        ("p2p_overlap", 0.0, 0.9),
        ("elementwise_passes", 2.0, 24.0),
        ("layer_overhead_us", 0.0, 200.0),
        ("chunk_overhead_us", 0.0, 2000.0),
        ("cp_step_overhead_us", 0.0, 2000.0),
    ],
    # Two fit rows per Blackwell cluster (8B TP1 DP8, 405B TP4 PP>1): two knobs, the FP8
    # GEMM fraction and the per-layer fixed cost; the H100's software knobs stay (same
    # Megatron + TE stack): attention, TP/p2p overlap, elementwise passes, chunk and CP costs.
    "dgx_b200": [("fraction.fp8", 0.25, 0.9), ("layer_overhead_us", 0.0, 1000.0)],
    "gb200_nvl72": [("fraction.fp8", 0.25, 0.9), ("layer_overhead_us", 0.0, 1000.0)],
}
#: Software-stack knobs copied from the DGX H100 fit before fitting the clusters named here.
FROM_H100 = (
    "attention",
    "tp_overlap",
    "p2p_overlap",
    "elementwise_passes",
    "chunk_overhead_us",
    "cp_step_overhead_us",
)
SHARED = {"dgx_b200": "dgx_h100", "gb200_nvl72": "dgx_h100"}


def all_rows() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of both fixtures and the models (defined in FIX)."""
    data = json.loads(FIX.read_text())
    return data["rows"] + json.loads(BLACKWELL.read_text())["rows"], data["models"]


def base_cluster(name: str) -> ClusterSpec:
    """The shipped cluster description."""
    return cluster_spec(compose("megatron_22b_pretrain_8gpu_a100_bf16", [f"cluster={name}"]))


def with_knob(cluster: ClusterSpec, knob: str, value: float) -> ClusterSpec:
    """`cluster` with one knob set."""
    if knob.startswith("fraction."):
        fr = dict(cluster.achievable_fraction)
        fr[knob.split(".", 1)[1]] = value
        return replace(cluster, achievable_fraction=fr)
    return replace(cluster, efficiency=replace(cluster.efficiency, **{knob: value}))


def errors(cluster: ClusterSpec, rows: list[dict[str, Any]], models: dict[str, Any]) -> list[float]:
    """Relative step-time error (predicted / measured - 1) of each row on `cluster`."""
    out = []
    for row in rows:
        inp = row_input(row, models, cluster)
        pred = evaluate(inp, row_layout(row)).rates.step_s
        out.append(pred / measured_step_s(row, inp.model) - 1.0)
    return out


def layer_errors(cluster: ClusterSpec, models: dict[str, Any]) -> list[float]:
    """Relative error of the per-layer times of Korthikanti et al. 2022 Table 4 (A100 only)."""
    if cluster.name != "dgx_a100_80gb":
        return []
    table = json.loads(KORTHIKANTI.read_text())["table4"]
    shape = models["gpt_22b"]
    out = []
    for row in table["rows"]:
        pred, meas = layer_row_s(table, row, shape, cluster)
        out.append(pred / meas - 1.0)
    return out


def loss(cluster: ClusterSpec, rows: list[dict[str, Any]], models: dict[str, Any]) -> float:
    """Mean |log(predicted / measured)| over the step-time rows and, on A100, Table 4's
    per-layer rows."""
    errs = errors(cluster, rows, models) + layer_errors(cluster, models)
    return sum(abs(math.log1p(e)) for e in errs) / len(errs)


def fit(name: str) -> tuple[ClusterSpec, dict[str, float]]:
    """Coordinate descent over the knobs of `name` on its fit rows."""
    every, models = all_rows()
    rows = [r for r in every if r["cluster"] == name and r["fit"]]
    cluster, values = base_cluster(name), {}
    for knob, value in FIXED.get(name, {}).items():
        cluster = with_knob(cluster, knob, value)
    if name in SHARED:
        source = base_cluster(SHARED[name]).efficiency
        for knob in FROM_H100:
            cluster = with_knob(cluster, knob, getattr(source, knob))
    for knob, lo, hi in KNOBS[name]:
        values[knob] = (lo + hi) / 2
        cluster = with_knob(cluster, knob, values[knob])
    for _ in range(6):
        for knob, lo, hi in KNOBS[name]:
            grid = [lo + (hi - lo) * i / 40 for i in range(41)]
            best = min(grid, key=lambda v: loss(with_knob(cluster, knob, v), rows, models))
            values[knob] = best
            cluster = with_knob(cluster, knob, best)
    return cluster, values


def main() -> None:
    name = sys.argv[1]
    every, models = all_rows()
    cluster, values = fit(name)
    mine = [r for r in every if r["cluster"] == name]
    errs = errors(cluster, mine, models)
    report: dict[str, Any] = {"cluster": name, "knobs": {k: round(v, 4) for k, v in values.items()}}
    for label, want in (("fit", True), ("held_out", False)):
        e = [abs(x) for x, r in zip(errs, mine, strict=True) if r["fit"] == want]
        report[label] = {"rows": len(e), "mean_abs": sum(e) / len(e), "max_abs": max(e)}
    report["rows"] = {r["id"]: round(x, 4) for x, r in zip(errs, mine, strict=True)}
    report["table4_layers"] = [round(x, 4) for x in layer_errors(cluster, models)]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
