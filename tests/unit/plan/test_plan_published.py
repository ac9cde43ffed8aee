"""Accuracy against published measured runs (tests/fixtures/plan/*.json, each row cites its line).

- published_runs.json: 30 runs from 3 independent sources (Korthikanti et al. 2022 Table 5 on
  A100 BF16; NeMo 24.07 and Megatron-Bridge performance tables on H100 FP8), 5B to 1T. The
  cluster knobs were fitted on the rows marked fit=true (benchmarks/plan_fit.py); the others
  are held out. Step time must be within 10 % on average and 25 % on every row, for the fit
  and the held-out rows separately.
- Each row's model shape reproduces the source's own "model TFLOP/s" from its tokens/s.
- Megatron-Bridge's layouts fit at their published recompute setting (none) and rank in the
  planner's top 10; Korthikanti's formulas (Table 2) and recompute savings (Sec. 5) hold.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from llmctl.config import compose
from llmctl.plan import ClusterSpec, Layout, PlanInput, Recompute, Sharding, evaluate, plan
from llmctl.plan.flops import step_flops
from llmctl.plan.memory import layer_activation_bytes
from llmctl.plan.reference import (
    layer_row_s,
    measured_step_s,
    model_spec,
    row_input,
    row_layout,
)
from llmctl.run.planning import cluster_spec, plan_input

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "plan"
PUBLISHED = json.loads((FIXTURES / "published_runs.json").read_text())
ROWS: list[dict[str, Any]] = PUBLISHED["rows"]
KORTHIKANTI = json.loads((FIXTURES / "korthikanti_2022.json").read_text())


@cache
def _cluster(name: str) -> ClusterSpec:
    return cluster_spec(compose("megatron_22b_pretrain_8gpu_a100_bf16", [f"cluster={name}"]))


@cache
def _recipe(recipe: str) -> PlanInput:
    return plan_input(compose(recipe, []))


def _error(row: dict[str, Any]) -> float:
    inp = row_input(row, PUBLISHED["models"], _cluster(row["cluster"]))
    ev = evaluate(inp, row_layout(row))
    return ev.rates.step_s / measured_step_s(row, inp.model) - 1.0


def test_fixture_covers_the_promised_range() -> None:
    sources = {r["source"] for r in ROWS}
    params = [step_flops(model_spec(r["model"], PUBLISHED["models"][r["model"]]), 1) for r in ROWS]
    assert len(ROWS) >= 20 and len(sources) >= 3
    assert {r["cluster"] for r in ROWS} == {"dgx_a100_80gb", "dgx_h100"}
    assert {r["dtype"] for r in ROWS} == {"bf16", "fp8"}
    assert all(r["cite"] for r in ROWS)
    assert min(params) < max(params) / 100  # 5B ... 1T
    assert sum(not r["fit"] for r in ROWS) > len(ROWS) / 2  # most rows held out
    moe = [r for r in ROWS if r.get("moe")]
    assert moe and not any(r["fit"] for r in moe)  # MoE rows: held out, never fitted
    assert all(PUBLISHED["models"][r["model"]]["experts"] > 1 and r["ep"] > 1 for r in moe)


@pytest.mark.parametrize("row", [r for r in ROWS if "tflops_per_gpu" in r], ids=lambda r: r["id"])
def test_fixture_shapes_reproduce_the_published_model_tflops(row: dict[str, Any]) -> None:
    """The source's TFLOP/s from its tokens/s: NeMo 24.07 counts non-causal attention
    (Narayanan et al. 2021), Bridge counts causal attention (Megatron's current formula).
    One Bridge row (26.04.01, 70B) is 2.3 % off its own tokens/s; 2.5 % still pins shapes."""
    model = model_spec(row["model"], PUBLISHED["models"][row["model"]])
    causal = row["source"] == "bridge"
    per_token = step_flops(model, 1, causal=causal) / model.seq_length
    tflops = row["tokens_per_s_per_gpu"] * per_token / 1e12
    assert tflops == pytest.approx(row["tflops_per_gpu"], rel=0.025)


@pytest.mark.parametrize("fit", [True, False], ids=["fit_rows", "held_out_rows"])
def test_step_time_error_against_published_runs(fit: bool) -> None:
    """Dense rows (the MoE rows: test_moe_step_time_error_against_published_runs)."""
    errors = {r["id"]: _error(r) for r in ROWS if r["fit"] == fit and not r.get("moe")}
    mean = sum(abs(e) for e in errors.values()) / len(errors)
    worst = max(errors.items(), key=lambda kv: abs(kv[1]))
    assert mean <= 0.10, errors
    assert abs(worst[1]) <= 0.25, worst


def _moe_rows(excluded: bool) -> list[dict[str, Any]]:
    return [r for r in ROWS if r.get("moe") and bool(r.get("moe_excluded")) == excluded]


def test_moe_step_time_error_against_published_runs() -> None:
    """Megatron-Bridge's Qwen3 MoE runs (H100 FP8), all held out: no MoE-specific parameter
    is fitted (llmctl/plan/moe.py: router, token permutation, grouped expert GEMMs on the
    dense GEMM shape model, all-to-alls exposed or overlapped as each recipe sets
    `moe_a2a_overlap`). Same targets as the dense rows."""
    errors = {r["id"]: _error(r) for r in _moe_rows(excluded=False)}
    assert len(errors) >= 3 and {r["model"] for r in _moe_rows(False)} >= {
        "qwen3_30b_a3b",
        "qwen3_235b_a22b",
    }
    mean = sum(abs(e) for e in errors.values()) / len(errors)
    worst = max(errors.items(), key=lambda kv: abs(kv[1]))
    assert mean <= 0.10, errors
    assert abs(worst[1]) <= 0.25, worst


def test_moe_excluded_rows_are_the_documented_gap() -> None:
    """The two Qwen3-30B PP2 rows (EP8 in one node, 1-2 layers per virtual stage) run about
    3x slower than the model predicts (-67 % and -68 %), at the same time per token with MBS
    1 and 2; the fixture states what is known of the gap. Held to that figure so a change
    that closes or widens it shows up here."""
    rows = _moe_rows(excluded=True)
    assert [r["model"] for r in rows] == ["qwen3_30b_a3b"] * 2
    assert sorted(r["mbs"] for r in rows) == [1, 2]
    for row in rows:
        assert "per token" in row["moe_excluded"]
        assert -0.75 <= _error(row) <= -0.60, row["id"]


def test_moe_a2a_overlap_hides_all_to_all_under_compute() -> None:
    """With megatron-core's EP overlap the 235B all-to-alls hide under another micro-batch's
    compute: less exposed all-to-all time, never less than the all-to-all beyond compute."""
    row = next(r for r in _moe_rows(False) if r["model"] == "qwen3_235b_a22b")
    inp = row_input(row, PUBLISHED["models"], _cluster(row["cluster"]))
    on = evaluate(inp, row_layout(row)).time
    off_inp = replace(inp, run=replace(inp.run, moe_a2a_overlap=False))
    off = evaluate(off_inp, row_layout(row)).time
    assert on.moe_comm_s < off.moe_comm_s
    assert on.moe_comm_s >= off.moe_comm_s - on.compute_s


def test_grouped_expert_gemm_uses_the_dense_shape_model() -> None:
    """One group is the dense GEMM; small per-expert M costs more per FLOP (HBM floor and
    tile waste), and sharing waves across experts never costs more than separate GEMMs."""
    from llmctl.plan.moe import grouped_gemm_s
    from llmctl.plan.perf import gemm_s

    h100 = _cluster("dgx_h100")
    for m, n, k in ((4096, 1536, 2048), (100, 768, 2048), (8192, 4096, 1536)):
        assert grouped_gemm_s(h100, "fp8", 1, m, n, k) == pytest.approx(
            gemm_s(h100, "fp8", m, n, k)
        )
    big = grouped_gemm_s(h100, "fp8", 16, 4096, 1536, 2048) / (4096 * 16)
    small = grouped_gemm_s(h100, "fp8", 16, 64, 1536, 2048) / (64 * 16)
    assert small > 2 * big
    assert grouped_gemm_s(h100, "fp8", 16, 200, 1536, 2048) <= 16 * gemm_s(
        h100, "fp8", 200, 1536, 2048
    )


def test_bridge_layouts_fit_without_recompute() -> None:
    """Megatron-Bridge's 70B (TP4 PP8 VPP5 DP2) and 405B (TP8 PP8 VPP8 CP2 DP8) run without
    recompute on 80 GB H100s; they fit only with bf16 gradients and FP8 weights counted as
    megatron-core and Transformer Engine keep them."""
    dense = (r for r in ROWS if r["source"] == "bridge" and not r.get("moe"))
    for row in (r for r in dense if r["model"] != "llama3_8b"):
        inp = row_input(row, PUBLISHED["models"], _cluster(row["cluster"]))
        assert inp.run.grad_dtype == "bf16" and inp.run.fp8_param_gather
        layout = row_layout(row)
        assert layout.recompute == Recompute.none
        ev = evaluate(inp, layout)
        assert ev.fits, (row["id"], ev.memory)
        fp32 = evaluate(replace(inp, run=replace(inp.run, grad_dtype="fp32")), layout)
        assert fp32.memory.grads_gib == pytest.approx(2 * ev.memory.grads_gib)


def test_precision_defaults_follow_megatron() -> None:
    bf16 = plan_input(compose("gpt3_175b_pretrain_64gpu_a100_bf16", []))
    assert (bf16.run.grad_dtype, bf16.run.grad_reduce_dtype, bf16.run.fp8) == (
        "fp32",
        "fp32",
        False,
    )
    fp8 = plan_input(compose("llama3_8b_pretrain_8gpu_h100_fp8", ["precision.grad_dtype=null"]))
    assert fp8.run.grad_dtype == "fp32" and fp8.run.fp8_param_gather
    assert fp8.run.attention.value == "flash"
    cpu = plan_input(compose("tiny_cpu", []))
    assert cpu.run.attention.value == "unfused"
    off = plan_input(
        compose("llama3_8b_pretrain_8gpu_h100_fp8", ["precision.fp8_param_gather=false"])
    )
    lay = Layout(tp=1, pp=1, dp=8, micro_batch_size=1)
    on_mem, off_mem = evaluate(fp8, lay).memory, evaluate(off, lay).memory
    assert off_mem.fp8_buffers_gib > 10 * on_mem.fp8_buffers_gib
    assert off_mem.weights_gib > on_mem.weights_gib


BRIDGE_RECIPES = {
    "llama3_8b_pretrain_8gpu_h100_fp8": Layout(tp=1, dp=8, optimizer_sharding=Sharding.full),
    "llama3_70b_pretrain_64gpu_h100_fp8": Layout(
        tp=4, pp=8, vpp=5, dp=2, sequence_parallel=True, loss_balanced=True
    ),
    "llama31_405b_pretrain_1024gpu_h100_fp8": Layout(
        tp=8, pp=8, vpp=8, cp=2, dp=8, sequence_parallel=True
    ),
}


def _rank(inp: PlanInput, layout: Layout) -> int:
    res = plan(replace(inp, search=replace(inp.search, top_k=50)), suggest=False)
    return next(i for i, e in enumerate(res.ranked, 1) if e.layout == layout)


@pytest.mark.parametrize("recipe", sorted(BRIDGE_RECIPES))
def test_bridge_layouts_rank_in_the_top_10(recipe: str) -> None:
    assert _rank(_recipe(recipe), BRIDGE_RECIPES[recipe]) <= 10


@pytest.mark.parametrize("model", KORTHIKANTI["models"], ids=lambda m: m["name"])
def test_korthikanti_layouts_rank_in_the_top_10(model: dict[str, Any]) -> None:
    """The 22B layout (TP8, one micro-batch of 4) is 10th: 9 layouts are predicted 0.3-4.1 %
    faster, less than the model's error on that very row (docs/planner.md, "Picks")."""
    layout = Layout(
        tp=model["tp"],
        pp=model["pp"],
        micro_batch_size=model["mbs"],
        sequence_parallel=True,
        recompute=Recompute.selective,
        optimizer_sharding=Sharding.none,
    )
    assert _rank(_recipe(model["recipe"]), layout) <= 10


def test_one_rank_sharding_groups_are_one_layout() -> None:
    """With DP*CP = 1 the distributed optimizer and FSDP shard over nothing: the search lists
    such a layout once (no sharding), so ranks count distinct runs."""
    res = plan(_recipe("gpt3_175b_pretrain_64gpu_a100_bf16"), suggest=False)
    ones = [e.layout for e in res.ranked if e.layout.dp * e.layout.cp == 1]
    assert ones and all(lay.optimizer_sharding == Sharding.none for lay in ones)
    assert len(set(ones)) == len(ones)


TABLE4 = KORTHIKANTI["table4"]


@pytest.mark.parametrize("row", TABLE4["rows"], ids=lambda r: r["name"].replace(" ", "_"))
def test_korthikanti_table4_layer_times(row: dict[str, Any]) -> None:
    """Per-layer forward + backward time of the 22B model (Table 4; these rows are in the A100
    fit, so this pins the model's shape: SP, selective and full recompute per layer)."""
    pred, measured = layer_row_s(
        TABLE4, row, PUBLISHED["models"]["gpt_22b"], _cluster("dgx_a100_80gb")
    )
    assert pred == pytest.approx(measured, rel=0.06)


def test_korthikanti_table4_recompute_overheads() -> None:
    """Full recompute costs about one more forward (Table 4: +39 %), selective recompute a few
    percent (+7 %); the model must keep that order and size."""
    shape, cluster = PUBLISHED["models"]["gpt_22b"], _cluster("dgx_a100_80gb")
    by_name = {r["name"]: layer_row_s(TABLE4, r, shape, cluster)[0] for r in TABLE4["rows"]}
    base = by_name["baseline no recompute"]
    assert 0.30 < by_name["baseline with recompute"] / base - 1 < 0.48
    assert 0.0 < by_name["selective recompute"] / base - 1 < 0.12


def test_micro_batch_size_and_vpp_change_the_step_time() -> None:
    inp = _recipe("llama3_70b_pretrain_64gpu_h100_fp8")
    base = Layout(tp=4, pp=8, vpp=5, dp=2, sequence_parallel=True, loss_balanced=True)
    times = {
        (mbs, vpp): evaluate(inp, replace(base, micro_batch_size=mbs, vpp=vpp)).rates.step_s
        for mbs in (1, 2)
        for vpp in (1, 2, 5, 10)
    }
    assert abs(times[(1, 1)] / times[(2, 1)] - 1) > 0.02  # micro-batch size matters
    by_vpp = {vpp: times[(1, vpp)] for vpp in (1, 2, 5, 10)}
    assert by_vpp[5] < by_vpp[1] and by_vpp[10] > by_vpp[5]  # interleaving pays, then costs


def _korthikanti(model: dict[str, Any]) -> tuple[PlanInput, Layout]:
    inp = _recipe(model["recipe"])
    layout = Layout(
        tp=model["tp"],
        pp=model["pp"],
        dp=1,
        micro_batch_size=model["mbs"],
        sequence_parallel=True,
        recompute=Recompute.selective,
        optimizer_sharding=Sharding.none,
    )
    return inp, layout


@pytest.mark.parametrize("model", KORTHIKANTI["models"], ids=lambda m: m["name"])
def test_korthikanti_mfu_from_flop_accounting_within_1pct(model: dict[str, Any]) -> None:
    inp, _ = _korthikanti(model)
    assert (inp.model.num_layers, inp.model.hidden_size) == (model["layers"], model["hidden"])
    flops = step_flops(inp.model, model["gbs"], causal=False)
    peak = KORTHIKANTI["a100_peak_tflops"] * 1e12
    mfu = flops / model["iteration_s_present_work"] / model["num_gpus"] / peak
    assert mfu == pytest.approx(model["mfu"], rel=0.01)


@pytest.mark.parametrize("model", KORTHIKANTI["models"], ids=lambda m: m["name"])
def test_korthikanti_table2_activation_formulas(model: dict[str, Any]) -> None:
    inp, _ = _korthikanti(model)
    m, run = inp.model, inp.run
    assert run.attention.value == "unfused"
    s, b, h, a, t = m.seq_length, model["mbs"], m.hidden_size, m.num_attention_heads, model["tp"]
    sbh = s * b * h

    def act(tp: int, sp: bool, rc: Recompute) -> float:
        return layer_activation_bytes(m, run, tp=tp, cp=1, mbs=b, sp=sp, recompute=rc)

    assert act(1, False, Recompute.none) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(t, False, Recompute.none) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(t, True, Recompute.none) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert act(t, False, Recompute.selective) == pytest.approx(sbh * (10 + 24 / t))
    assert act(t, True, Recompute.selective) == pytest.approx(sbh * 34 / t)
    assert act(t, False, Recompute.full) == pytest.approx(2 * sbh)


@pytest.mark.parametrize("name", ["gpt3_175b", "megatron_530b"])
def test_korthikanti_selective_recompute_savings(name: str) -> None:
    model = next(m for m in KORTHIKANTI["models"] if m["name"] == name)
    inp, _ = _korthikanti(model)
    kw = dict(tp=1, cp=1, mbs=1, sp=False)
    full = layer_activation_bytes(inp.model, inp.run, recompute=Recompute.none, **kw)  # type: ignore[arg-type]
    kept = layer_activation_bytes(inp.model, inp.run, recompute=Recompute.selective, **kw)  # type: ignore[arg-type]
    published = KORTHIKANTI["selective_recompute_activation_savings"][name]
    assert 1 - kept / full == pytest.approx(published, abs=0.005)


@pytest.mark.parametrize("model", KORTHIKANTI["models"], ids=lambda m: m["name"])
def test_korthikanti_published_layouts_fit_in_80gb(model: dict[str, Any]) -> None:
    inp, layout = _korthikanti(model)
    assert evaluate(inp, layout).fits
