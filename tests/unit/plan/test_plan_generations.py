"""Step-time accuracy per GPU generation on published runs (fit vs held out, Blackwell apart).

- Ampere (A100) and Hopper (H100) rows: tests/fixtures/plan/published_runs.json (the split
  is the fixture's `fit` flag; its `split` text names the fitted rows).
- Blackwell rows (DGX B200, GB200 NVL72): tests/fixtures/plan/published_runs_blackwell.json,
  Megatron-Bridge 25.09/25.11/26.02; its knobs were fitted on the 25.11 FP8-CS rows only
  (benchmarks/plan_fit.py), the other rows are held out.
Targets on held-out rows (issue 21): dense mean |error| <= 5 %, MoE <= 10 %, no row > 15 %.
MoE rows flagged `moe_excluded` are the documented gap (test_plan_published.py) and are not
in the targets. Every cluster file of a current GPU composes and plans a recipe.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from llmctl.config import compose
from llmctl.plan import ClusterSpec, evaluate
from llmctl.plan.flops import step_flops
from llmctl.plan.reference import measured_step_s, model_spec, row_input, row_layout
from llmctl.run.planning import cluster_spec, plan_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "plan"
PUBLISHED = json.loads((FIXTURES / "published_runs.json").read_text())
BLACKWELL = json.loads((FIXTURES / "published_runs_blackwell.json").read_text())
MODELS: dict[str, Any] = PUBLISHED["models"]
GENERATION = {
    "dgx_a100_80gb": "ampere",
    "dgx_h100": "hopper",
    "dgx_b200": "blackwell",
    "gb200_nvl72": "blackwell",
}
ROWS = [r for r in PUBLISHED["rows"] + BLACKWELL["rows"] if not r.get("moe_excluded")]


@cache
def _cluster(name: str) -> ClusterSpec:
    return cluster_spec(compose("megatron_22b_pretrain_8gpu_a100_bf16", [f"cluster={name}"]))


def _error(row: dict[str, Any]) -> float:
    inp = row_input(row, MODELS, _cluster(row["cluster"]))
    return evaluate(inp, row_layout(row)).rates.step_s / measured_step_s(row, inp.model) - 1.0


def _rows(generation: str, moe: bool, fit: bool) -> dict[str, float]:
    return {
        r["id"]: _error(r)
        for r in ROWS
        if GENERATION[r["cluster"]] == generation and bool(r.get("moe")) == moe and r["fit"] == fit
    }


def test_blackwell_fixture_is_cited_and_mostly_held_out() -> None:
    rows = BLACKWELL["rows"]
    assert {r["cluster"] for r in rows} == {"dgx_b200", "gb200_nvl72"}
    assert all(r["cite"] and r["source"] in BLACKWELL["sources"] for r in rows)
    for cluster in ("dgx_b200", "gb200_nvl72"):
        mine = [r for r in rows if r["cluster"] == cluster]
        assert 0 < sum(r["fit"] for r in mine) < sum(not r["fit"] for r in mine)
    assert len({r["id"] for r in rows}) == len(rows)


@pytest.mark.parametrize("row", BLACKWELL["rows"], ids=lambda r: r["id"])
def test_blackwell_shapes_reproduce_the_published_model_tflops(row: dict[str, Any]) -> None:
    """Bridge's TFLOP/s/GPU from its tokens/s/GPU (causal attention FLOPs), within 2.5 %."""
    model = model_spec(row["model"], MODELS[row["model"]])
    per_token = step_flops(model, 1, causal=True) / model.seq_length
    assert row["tokens_per_s_per_gpu"] * per_token / 1e12 == pytest.approx(
        row["tflops_per_gpu"], rel=0.025
    )


@pytest.mark.parametrize(
    ("generation", "moe", "mean_max"),
    [("ampere", False, 0.05), ("hopper", False, 0.05), ("hopper", True, 0.10),
     ("blackwell", False, 0.05)],
)  # fmt: skip
def test_held_out_error_per_generation(generation: str, moe: bool, mean_max: float) -> None:
    errors = _rows(generation, moe, fit=False)
    assert len(errors) >= 3
    mean = sum(abs(e) for e in errors.values()) / len(errors)
    worst = max(errors.items(), key=lambda kv: abs(kv[1]))
    print(f"{generation} {'moe' if moe else 'dense'} held out: {len(errors)} rows, mean "
          f"{mean:.1%}, worst {worst[0]} {worst[1]:+.1%}")  # fmt: skip
    assert mean <= mean_max, errors
    assert abs(worst[1]) <= 0.15, worst


@pytest.mark.parametrize("generation", ["ampere", "hopper", "blackwell"])
def test_fit_rows_are_reproduced(generation: str) -> None:
    errors = _rows(generation, False, fit=True)
    assert errors and max(abs(e) for e in errors.values()) <= 0.10, errors


@pytest.mark.parametrize(
    "cluster", ["dgx_b200", "gb200_nvl72", "dgx_h800", "hgx_h20", "mi300x", "mi325x"]
)
def test_every_current_gpu_plans_a_recipe(cluster: str) -> None:
    """Each cluster file composes and plans Llama-3 70B on 8 nodes at FP8."""
    overrides = [f"cluster={cluster}", "cluster.num_nodes=8", "cluster.gpus_per_node=8"]
    res = plan_config(compose("llama3_70b_pretrain_64gpu_h100_fp8", overrides))
    assert res.best is not None and res.best.rates.step_s > 0


def test_slower_links_and_compute_cost_time() -> None:
    """H800 is H100 with NVLink cut to 400 GB/s: TP8 costs more there; H20 has 15 % of the
    H100's FP8 peak: the same layout is several times slower."""
    from llmctl.plan import Evaluation, Layout
    from llmctl.run.planning import plan_input

    lay = Layout(tp=8, pp=4, vpp=5, dp=2, sequence_parallel=True)

    def ev(cluster: str) -> Evaluation:
        cfg = compose("llama3_70b_pretrain_64gpu_h100_fp8", [f"cluster={cluster}"])
        return evaluate(plan_input(cfg), lay)

    h100, h800, h20 = ev("dgx_h100"), ev("dgx_h800"), ev("hgx_h20")
    assert h800.time.tp_comm_s > 1.5 * h100.time.tp_comm_s
    assert h800.rates.step_s > h100.rates.step_s
    assert h20.rates.step_s > 3 * h100.rates.step_s
