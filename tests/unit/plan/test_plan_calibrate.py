"""Calibration from measured runs rescales achievable fraction and fragmentation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_plan_search import H100, LLAMA, RUN

from llmctl.plan import Layout, PerfRecord, PlanInput, calibrate, evaluate


def test_calibration_scales_the_achievable_fraction() -> None:
    inp = PlanInput(model=LLAMA, cluster=H100, run=RUN)
    lay = Layout(tp=2, dp=32, micro_batch_size=1, sequence_parallel=True)
    before = evaluate(inp, lay)
    rec = PerfRecord(
        cluster="h100",
        dtype="bf16",
        predicted_step_s=before.rates.step_s,
        measured_step_s=before.rates.step_s * 1.25,
        predicted_peak_mem_gib=before.memory.total_gib,
        measured_peak_mem_gib=before.memory.total_gib * 1.1,
    )
    cal = calibrate(H100, [rec])
    assert cal.achievable_fraction["bf16"] == pytest.approx(0.7 / 1.25)
    assert cal.fragmentation_fraction > H100.fragmentation_fraction
    after = evaluate(replace(inp, cluster=cal), lay)
    assert after.rates.step_s > before.rates.step_s * 1.15
    assert after.memory.total_gib > before.memory.total_gib


def test_records_of_other_clusters_are_ignored() -> None:
    rec = PerfRecord(
        cluster="other",
        dtype="bf16",
        predicted_step_s=1.0,
        measured_step_s=2.0,
        predicted_peak_mem_gib=10.0,
    )
    assert calibrate(H100, [rec]) == H100
    with pytest.raises(ValueError):
        PerfRecord(
            cluster="h100",
            dtype="bf16",
            predicted_step_s=0,
            measured_step_s=1,
            predicted_peak_mem_gib=1,
        )
