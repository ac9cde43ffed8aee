"""Calibration refits the step-time knobs to measured runs and keeps the model's structure.

The measured runs here are synthetic on purpose (a known ground truth: the same model with
other knobs); real measured runs are the oracle of tests/integration/test_plan_calibrate_cpu.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_plan_search import H100, LLAMA, RUN

from llmctl.plan import Layout, PerfRecord, PlanInput, calibrate, evaluate
from llmctl.plan.calibrate import MeasuredRun, calibrate_time, loss, with_knob


def _truth_runs(truth: object, layouts: list[Layout]) -> list[MeasuredRun]:
    out = []
    for lay in layouts:
        inp = PlanInput(model=LLAMA, cluster=truth, run=RUN)  # type: ignore[arg-type]
        out.append(MeasuredRun(input=inp, layout=lay, step_s=evaluate(inp, lay).rates.step_s))
    return out


LAYOUTS = [
    Layout(tp=2, dp=32, micro_batch_size=1, sequence_parallel=True),
    Layout(tp=4, pp=4, dp=4, micro_batch_size=2, sequence_parallel=True),
    Layout(tp=8, pp=2, vpp=2, dp=4, micro_batch_size=1, sequence_parallel=True),
]


def test_one_run_fits_the_host_speed_and_predicts_other_layouts() -> None:
    truth = with_knob(H100, "scale", 1.7)
    fitted = calibrate_time(H100, _truth_runs(truth, LAYOUTS[:1]))
    for lay in LAYOUTS:
        inp = PlanInput(model=LLAMA, cluster=truth, run=RUN)
        want = evaluate(inp, lay).rates.step_s
        got = evaluate(replace(inp, cluster=fitted), lay).rates.step_s
        assert got == pytest.approx(want, rel=0.03)


def test_three_runs_fit_the_overheads() -> None:
    base = replace(H100, efficiency=replace(H100.efficiency, chunk_overhead_us=0.0))
    truth = with_knob(base, "chunk_overhead_us", 4000.0)
    runs = _truth_runs(truth, LAYOUTS)
    fitted = calibrate_time(base, runs)
    assert loss(fitted, runs) < 0.2 * loss(base, runs)
    held_out = Layout(tp=4, pp=2, dp=8, micro_batch_size=4, sequence_parallel=True)
    inp = PlanInput(model=LLAMA, cluster=truth, run=RUN)
    want = evaluate(inp, held_out).rates.step_s
    assert evaluate(replace(inp, cluster=fitted), held_out).rates.step_s == pytest.approx(
        want, rel=0.05
    )


def test_memory_calibration_rescales_fragmentation_of_this_cluster_only() -> None:
    rec = PerfRecord(
        cluster="h100",
        dtype="bf16",
        predicted_step_s=1.0,
        measured_step_s=1.0,
        predicted_peak_mem_gib=50.0,
        measured_peak_mem_gib=55.0,
    )
    frag = calibrate(H100, [rec]).fragmentation_fraction
    assert (1 + frag) == pytest.approx((1 + H100.fragmentation_fraction) * 1.1)
    other = replace(rec, cluster="a100")
    assert calibrate(H100, [other]) == H100
