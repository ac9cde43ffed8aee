from __future__ import annotations

import json
import math

from llmctl.config import compose
from llmctl.run.metrics import (
    MetricsLog,
    PerfReport,
    flops_per_token,
    peak_tflops_for,
    perf_markdown,
    steady_state_step_s,
    write_perf,
)


def test_flops_per_token_by_hand_for_tiny():
    m = compose("tiny_cpu", []).model  # h=64, f=256, a=4, g=2, V=4096, L=2, s=64, SwiGLU
    head = 64 // 4
    per_layer = 64 * (4 * head + 2 * 2 * head) + 4 * head * 64 + 3 * 64 * 256
    expected = 6 * (2 * per_layer + 4096 * 64) + 12 * 2 * 64 * (4 * head)
    assert flops_per_token(m) == expected


def test_gpt_style_counts_two_mlp_matrices():
    m = compose("tiny_cpu", ["model.activation=gelu"]).model
    swiglu = compose("tiny_cpu", []).model
    assert flops_per_token(swiglu) - flops_per_token(m) == 6 * 2 * 64 * 256


def test_peak_lookup_falls_back_from_fp8_to_bf16():
    cluster = compose("tiny_cpu", []).cluster
    assert peak_tflops_for(cluster, "fp32") == 0.16
    cluster.peak_tflops = {"bf16": 989.0}
    assert peak_tflops_for(cluster, "fp8") == 989.0
    assert peak_tflops_for(cluster, "fp16") is None


def test_steady_state_drops_warmup_steps():
    assert steady_state_step_s([5.0, 1.0, 1.0, 1.2, 0.8]) == 1.0
    assert math.isnan(steady_state_step_s([]))
    assert steady_state_step_s([2.0]) == 2.0


def test_metrics_log_writes_json_lines_with_null_for_nan(tmp_path):
    log = MetricsLog(tmp_path / "m" / "metrics.jsonl")
    log.write({"step": 1, "loss": float("nan")})
    log.write({"step": 2, "loss": 1.5})
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "loss": None}, {"step": 2, "loss": 1.5}]


def test_perf_files_hold_the_contract_fields(tmp_path):
    report = PerfReport(
        cluster="dgx_h100",
        layout={"tp": 8, "pp": 1},
        dtype="bf16",
        num_devices=8,
        predicted_step_s=1.1,
        measured_step_s=1.0,
        predicted_peak_mem_gib=60.0,
        measured_peak_mem_gib=None,
        tokens_per_s=4096.0,
        predicted_tokens_per_s=3723.6,
        tflops_per_device=400.0,
        mfu=0.4,
        steps_measured=20,
    )
    write_perf(tmp_path, report)
    data = json.loads((tmp_path / "perf.json").read_text())
    for key in (
        "cluster",
        "layout",
        "dtype",
        "predicted_step_s",
        "measured_step_s",
        "predicted_peak_mem_gib",
        "measured_peak_mem_gib",
        "tokens_per_s",
    ):
        assert key in data
    md = perf_markdown(report)
    assert "| step time (s) | 1.1 | 1 | 1.10 |" in md
    assert "| peak memory (GiB) | 60 | n/a | n/a |" in md
    assert "MFU: 40.00%" in md
