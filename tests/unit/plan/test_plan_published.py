"""Accuracy against published measurements (real data; sources in tests/fixtures/plan/*.json).

- Megatron-Bridge DGX-H100 FP8 table: our FLOP accounting turns the published tokens/s into the
  published model TFLOP/s within 1%; predicted tokens/s/GPU of the published layout within 15%.
- Korthikanti et al. 2022: FLOP accounting turns Table 5 iteration times into the published
  MFU within 1%; the published activation-memory formulas (Table 2) and the selective-recompute
  savings of Section 5 are reproduced; the published layouts fit in 80 GB; predicted iteration
  time within 15% for 175B/530B/1T.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmctl.config import compose
from llmctl.config.planning import plan_input
from llmctl.plan import AttentionKernel, Layout, PlanInput, Recompute, Sharding, evaluate
from llmctl.plan.flops import step_flops
from llmctl.plan.memory import layer_activation_bytes

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "plan"
BRIDGE = json.loads((FIXTURES / "megatron_bridge_h100_fp8.json").read_text())["rows"]
KORTHIKANTI = json.loads((FIXTURES / "korthikanti_2022.json").read_text())
_INPUTS: dict[str, PlanInput] = {}


def _input(recipe: str) -> PlanInput:
    if recipe not in _INPUTS:
        _INPUTS[recipe] = plan_input(compose(recipe, []))
    return _INPUTS[recipe]


def _bridge_layout(row: dict[str, Any]) -> Layout:
    dp = row["num_gpus"] // (row["tp"] * row["pp"] * row["cp"])
    return Layout(
        tp=row["tp"],
        pp=row["pp"],
        vpp=row["vpp"],
        cp=row["cp"],
        dp=dp,
        micro_batch_size=row["mbs"],
        sequence_parallel=row["tp"] > 1,
        recompute=Recompute.none,
        sharding=Sharding.full if row["fsdp"] else Sharding.distributed,
    )


@pytest.mark.parametrize("row", BRIDGE, ids=lambda r: f"{r['model']}-{r['release']}")
def test_bridge_flop_accounting_within_1pct(row: dict[str, Any]) -> None:
    inp = _input(row["recipe"])
    assert inp.model.seq_length == row["seq"]
    flops_per_token = step_flops(inp.model, 1) / inp.model.seq_length
    tflops = row["tokens_per_s_per_gpu"] * flops_per_token / 1e12
    assert tflops == pytest.approx(row["tflops_per_gpu"], rel=0.01)


@pytest.mark.parametrize("row", BRIDGE, ids=lambda r: f"{r['model']}-{r['release']}")
def test_bridge_predicted_throughput_within_15pct(row: dict[str, Any]) -> None:
    base = _input(row["recipe"])
    inp = replace(base, run=replace(base.run, global_batch_size=row["gbs"], grad_dtype="bf16"))
    ev = evaluate(inp, _bridge_layout(row))
    assert ev.fits, ev.memory
    assert ev.rates.tokens_per_s_per_gpu == pytest.approx(row["tokens_per_s_per_gpu"], rel=0.15)


def _korthikanti(model: dict[str, Any]) -> tuple[PlanInput, Layout]:
    base = _input(model["recipe"])
    inp = replace(base, run=replace(base.run, attention=AttentionKernel.unfused))
    layout = Layout(
        tp=model["tp"],
        pp=model["pp"],
        dp=1,
        micro_batch_size=model["mbs"],
        sequence_parallel=True,
        recompute=Recompute.selective,
        sharding=Sharding.none,
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
    ev = evaluate(inp, layout)
    assert ev.memory.total_gib <= inp.cluster.hbm_gib


@pytest.mark.parametrize("model", KORTHIKANTI["models"][1:], ids=lambda m: m["name"])
def test_korthikanti_iteration_time_within_15pct(model: dict[str, Any]) -> None:
    inp, layout = _korthikanti(model)
    ev = evaluate(inp, layout)
    assert ev.rates.step_s == pytest.approx(model["iteration_s_present_work"], rel=0.15)
