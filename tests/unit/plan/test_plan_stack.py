"""`plan.stack` / `llmctl plan --stack`: the software stack's overlap behaviour."""

from __future__ import annotations

from functools import cache

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.config import compose
from llmctl.plan import Layout, PlanInput, evaluate
from llmctl.plan.stack import Stack, apply_stack
from llmctl.run.planning import plan_input

RECIPE = "llama3_70b_pretrain_64gpu_h100_fp8"
BRIDGE_70B = Layout(tp=4, pp=8, vpp=5, dp=2, sequence_parallel=True, loss_balanced=True)


@cache
def _inp(*overrides: str) -> PlanInput:
    return plan_input(compose(RECIPE, list(overrides)))


def test_megatron_te_is_the_fitted_default() -> None:
    default = _inp()
    assert compose(RECIPE, []).plan.stack == Stack.megatron_te
    assert _inp("plan.stack=megatron_te") == default
    assert apply_stack(default, Stack.megatron_te) is default
    assert default.cluster.efficiency.tp_overlap == 0.45


def test_pytorch_native_exposes_tp_and_p2p_communication() -> None:
    te, native = _inp(), _inp("plan.stack=pytorch_native")
    eff = native.cluster.efficiency
    assert (eff.tp_overlap, eff.tp_async_backward, eff.p2p_overlap) == (0.0, 0.0, 0.0)
    assert te.run.fp8_param_gather and not native.run.fp8_param_gather
    a, b = evaluate(te, BRIDGE_70B), evaluate(native, BRIDGE_70B)
    assert b.time.tp_comm_s > 2 * a.time.tp_comm_s
    assert b.time.pp_comm_s > a.time.pp_comm_s
    assert b.rates.step_s > 1.05 * a.rates.step_s
    assert b.memory.weights_gib > a.memory.weights_gib  # bf16 weights besides the FP8 copies


def test_stacks_agree_where_no_overlap_differs() -> None:
    """TP1 PP1 with FP8 gathers set explicitly: nothing the stack changes is in play."""
    lay = Layout(tp=1, pp=1, dp=64, micro_batch_size=1)
    set_gather = "precision.fp8_param_gather=true"
    te = evaluate(_inp(set_gather), lay)
    native = evaluate(_inp(set_gather, "plan.stack=pytorch_native"), lay)
    assert native.rates.step_s == pytest.approx(te.rates.step_s, rel=1e-12)


def test_moe_all_to_all_overlap_is_off_natively() -> None:
    """Bridge's Qwen3-235B H100 row overlaps its all-to-alls; natively they are exposed."""
    import json
    from pathlib import Path

    from llmctl.plan.reference import row_input, row_layout
    from llmctl.run.planning import cluster_spec

    data = json.loads((Path(__file__).parents[2] / "fixtures/plan/published_runs.json").read_text())
    row = next(r for r in data["rows"] if r["id"] == "bridge26.04.01-qwen3_235b_a22b")
    cluster = cluster_spec(compose(RECIPE, []))
    inp = row_input(row, data["models"], cluster)
    assert inp.run.moe_a2a_overlap
    native = apply_stack(inp, Stack.pytorch_native)
    assert not native.run.moe_a2a_overlap
    lay = row_layout(row)
    assert evaluate(native, lay).time.moe_comm_s > evaluate(inp, lay).time.moe_comm_s


def test_cli_stack_flag() -> None:
    runner = CliRunner()
    base = ["plan", f"recipe={RECIPE}", "--tp", "4", "--pp", "8", "--vpp", "5", "--json"]
    import json

    te = runner.invoke(app, base)
    native = runner.invoke(app, [*base, "--stack", "pytorch_native"])
    assert te.exit_code == 0 and native.exit_code == 0, native.output
    step = [json.loads(r.stdout)["ranked"][0]["step_s"] for r in (te, native)]
    assert step[1] > step[0]
    bad = runner.invoke(app, [*base, "--stack", "jax"])
    assert bad.exit_code != 0 and "plan.stack" in bad.output and "Traceback" not in bad.output
