"""llmctl.run.prom: the metric families of a rank, fed from the loop's per-step numbers, served
over a real HTTP endpoint; starts.jsonl; the numbers `llmctl status --json` shows."""

from __future__ import annotations

import json
import math
import socket
import statistics
import time
import urllib.request
from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.config.validate import validate
from llmctl.errors import UserError
from llmctl.plan import Layout, PlanRecord
from llmctl.run.layout import resolve_layout
from llmctl.run.metrics import MetricsLog, flops_per_token
from llmctl.run.prom import (
    STARTS_FILE,
    RankExporter,
    predictions,
    read_starts,
    record_start,
    start_metrics,
    status_metrics,
)

pytest.importorskip("prometheus_client")

PLAN = PlanRecord(
    layout=Layout(), layout_name="TP1 PP1", fits=True, peak_mem_gib=0.5, usable_gib=8.0,
    memory_gib={}, step_time_s=0.05, tokens_per_s=1e4, mfu=0.2,
)  # fmt: skip


def _samples(exposition: bytes) -> dict[tuple[str, str], float]:
    """(sample name, rank) -> value of every llmctl_ sample."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(exposition.decode()):
        for s in fam.samples:
            if s.name.startswith("llmctl_"):
                out[(s.name, s.labels.get("rank", ""))] = s.value
    return out


def _exporter(tmp_path: Path, rank: int = 0, peak: bool = True) -> RankExporter:
    cfg = compose("tiny_cpu", [f"train.run_dir={tmp_path}"])
    if not peak:
        cfg.cluster.peak_tflops = {}
    layout = resolve_layout(cfg, 1, None)
    return RankExporter(cfg, tmp_path, layout, rank=rank, on_gpu=False, plan=PLAN, ckpt=None)


def test_a_step_sets_the_measured_numbers_beside_the_predicted(tmp_path: Path) -> None:
    ex = _exporter(tmp_path)
    ex.step(7, 3.5, 0.9, 1e-3, 0.25, rank_cpu=[[0.2, 0.05, 0.9]])
    got = _samples(ex.m.exposition())
    tokens = 8 * 64  # global batch x sequence length of tiny_cpu
    cfg = compose("tiny_cpu", [])
    assert got["llmctl_train_step", "0"] == 7
    assert got["llmctl_train_target_steps", "0"] == cfg.train.train_iters
    assert got["llmctl_train_step_seconds_count", "0"] == 1
    assert got["llmctl_train_step_seconds_sum", "0"] == 0.25
    assert got["llmctl_train_last_step_seconds", "0"] == 0.25
    assert got["llmctl_train_tokens_total", "0"] == tokens
    assert got["llmctl_train_tokens_per_second", "0"] == pytest.approx(tokens / 0.25)
    flops = flops_per_token(cfg.model) * tokens / 0.25 / 0.16e12  # local_cpu: 0.16 TFLOP/s
    assert got["llmctl_train_mfu_ratio", "0"] == pytest.approx(flops)
    assert got["llmctl_train_loss", "0"] == 3.5
    assert got["llmctl_train_grad_norm", "0"] == 0.9
    assert got["llmctl_train_learning_rate", "0"] == 1e-3
    assert got["llmctl_train_last_step_busy_seconds", "0"] == pytest.approx(0.20)
    assert abs(got["llmctl_train_last_step_timestamp_seconds", "0"] - time.time()) < 60
    assert got["llmctl_host_rss_bytes", "0"] > 10 * 2**20
    assert got["llmctl_host_peak_rss_bytes", "0"] >= got["llmctl_host_rss_bytes", "0"] * 0.9
    assert got["llmctl_plan_step_seconds", "0"] == 0.05
    assert got["llmctl_plan_mfu_ratio", "0"] == 0.2
    assert got["llmctl_plan_tokens_per_second", "0"] == 1e4
    assert got["llmctl_plan_memory_bytes", "0"] == 0.5 * 2**30
    ex.step(8, math.nan, None, 1e-3, 0.5)
    got = _samples(ex.m.exposition())
    assert math.isnan(got["llmctl_train_loss", "0"])
    assert got["llmctl_train_step_seconds_count", "0"] == 2
    assert got["llmctl_train_step_seconds_bucket", "0"] == 2  # the last (+Inf) bucket wins


def test_unknown_numbers_are_absent_not_zero(tmp_path: Path) -> None:
    """Rank 1 exports no plan gauges; no grad norm, MFU (no peak) or checkpoint until known."""
    ex = _exporter(tmp_path, rank=1, peak=False)
    ex.step(1, 3.0, None, 1e-3, 0.1)
    names = {name for name, _ in _samples(ex.m.exposition())}
    assert "llmctl_train_step" in names
    for absent in ("llmctl_plan_step_seconds", "llmctl_train_mfu_ratio", "llmctl_train_grad_norm",
                   "llmctl_checkpoint_last_step", "llmctl_run_restarts"):  # fmt: skip
        assert absent not in names, absent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_served_per_rank_on_base_port_plus_local_rank(tmp_path, monkeypatch) -> None:
    port = _free_port() - 1
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = compose("tiny_cpu", [f"train.run_dir={tmp_path}", f"train.metrics.port={port}"])
    layout = resolve_layout(cfg, 1, None)
    ex = start_metrics(
        cfg, tmp_path, layout, rank=1, on_gpu=False, plan=PLAN, ckpt=None, start_step=0
    )
    assert ex is not None
    try:
        ex.step(3, 2.0, 1.0, 1e-3, 0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/metrics", timeout=10) as r:
            text = r.read()
        got = _samples(text)
        assert got["llmctl_train_step", "1"] == 3
        assert f'run="{tmp_path.name}"'.encode() in text
        assert f'host="{socket.gethostname()}"'.encode() in text
    finally:
        ex.close()
    with pytest.raises(OSError):  # closed: the port is free again, nothing answers
        urllib.request.urlopen(f"http://127.0.0.1:{port + 1}/metrics", timeout=2)
    assert not (tmp_path / STARTS_FILE).exists()  # only rank 0 records starts


def test_off_by_default_records_the_start_only(tmp_path: Path) -> None:
    cfg = compose("tiny_cpu", [f"train.run_dir={tmp_path}"])
    assert cfg.train.metrics.port == 0 and cfg.train.metrics.pushgateway is None
    assert cfg.train.metrics.address == "127.0.0.1"
    layout = resolve_layout(cfg, 1, None)
    ex = start_metrics(
        cfg, tmp_path, layout, rank=0, on_gpu=False, plan={}, ckpt=None, start_step=0
    )
    assert ex is None
    assert read_starts(tmp_path).num_starts == 1


def test_starts_count_restarts_and_layout_changes(tmp_path: Path) -> None:
    a, b = {"tp": 1, "dp": 2}, {"tp": 2, "dp": 1}
    record_start(tmp_path, 0, a)
    record_start(tmp_path, 10, a)
    with (tmp_path / STARTS_FILE).open("a") as f:
        f.write('{"layout": {"tp"')  # a line cut short by a crash
    record_start(tmp_path, 20, b)
    starts = record_start(tmp_path, 30, a)
    assert (starts.num_starts, starts.restarts, starts.layout_changes) == (4, 3, 2)


def test_predictions_take_what_the_plan_has() -> None:
    assert predictions(None) == {}
    plan = PlanRecord(
        layout=Layout(), layout_name="TP1", fits=True, peak_mem_gib=1.5, usable_gib=8.0,
        memory_gib={}, step_time_s=2.0, tokens_per_s=float("nan"), mfu=0.25,
    )  # fmt: skip
    want = {"step_seconds": 2.0, "mfu_ratio": 0.25, "memory_bytes": 1.5 * 2**30}
    assert predictions(plan) == want


def test_bad_metrics_settings_are_refused() -> None:
    with pytest.raises(UserError, match=r"train\.metrics\.port must be 0 \(off\) or a TCP port"):
        validate(compose("tiny_cpu", ["train.metrics.port=70000"]))
    with pytest.raises(UserError, match=r"push_interval_s must be > 0"):
        validate(compose("tiny_cpu", ["train.metrics.push_interval_s=0"]))


def test_status_metrics_are_the_exported_numbers(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN.file_dict()))
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        rec = {"step": step, "loss": 3.0 / step, "lr": 1e-3, "grad_norm": None}
        log.write({**rec, "step_time_s": 0.1 * step, "tokens_per_s": 5e3, "mfu": 0.01, "time": 1.0})
    log.close()
    record_start(tmp_path, 0, {"tp": 1})
    record_start(tmp_path, 1, {"tp": 2})
    got = status_metrics(tmp_path)
    assert got == {
        "llmctl_train_step": 2,
        "llmctl_train_last_step_seconds": 0.2,
        "llmctl_train_last_step_timestamp_seconds": 1.0,
        "llmctl_train_tokens_per_second": 5e3,
        "llmctl_train_mfu_ratio": 0.01,
        "llmctl_train_loss": 1.5,
        "llmctl_train_grad_norm": None,
        "llmctl_train_learning_rate": 1e-3,
        "llmctl_run_restarts": 1,
        "llmctl_run_layout_changes": 1,
        "llmctl_plan_step_seconds": 0.05,
        "llmctl_plan_tokens_per_second": 1e4,
        "llmctl_plan_mfu_ratio": 0.2,
        "llmctl_plan_memory_bytes": 0.5 * 2**30,
    }


def test_a_step_update_costs_under_a_thousandth_of_a_tiny_step(tmp_path: Path) -> None:
    """The training thread's share of the metrics: a tiny CPU step takes >= 50 ms here, so
    50 us per update is 0.1 % (the budget is 1 %); measured ~15 us."""
    ex = _exporter(tmp_path)
    times = []
    for step in range(2000):
        t0 = time.perf_counter()
        ex.step(step, 3.0, 1.0, 1e-3, 0.1, rank_cpu=[[0.08, 0.01, 0.9]])
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 50e-6, statistics.median(times)
