"""`llmctl top RUN_DIR --once [--json]` and the stragglers of `llmctl status`, on a run directory
whose files are written by llmctl's own writers (metrics log, plan record, straggler log,
launch record; a committed checkpoint directory); the real DP=2 run is in
tests/integration/test_straggler_live.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.launch.api import write_launch
from llmctl.plan import Layout, PlanRecord
from llmctl.run.ckpt_store import iter_name
from llmctl.run.metrics import MetricsLog
from llmctl.run.straggler import RankWindow, StragglerDetector, StragglerLog

PLAN = PlanRecord(
    layout=Layout(), layout_name="TP1 PP1", fits=True, peak_mem_gib=0.5, usable_gib=8.0,
    memory_gib={}, step_time_s=0.05, tokens_per_s=1e4, mfu=0.2,
)  # fmt: skip


def _run_dir(tmp_path: Path, *, steps: int = 30, finished: bool = True) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: tiny_cpu\ntrain:\n  train_iters: 100\n")
    (run / "plan.json").write_text(json.dumps(PLAN.file_dict()))
    record = {"kind": "local", "run_dir": str(run), "pid": 1}
    write_launch(run, {**record, "exit_code": 0} if finished else record)
    log = MetricsLog(run / "metrics.jsonl")
    now = time.time()
    for step in range(1, steps + 1):
        dt = 0.1 if step % 2 else 0.12
        rec = {"step": step, "loss": 5.0 - step / 100, "step_time_s": dt, "time": now - 3}
        log.write({**rec, "tokens_per_s": 5000.0, "mfu": 0.1, "mem_gib": 0.25})
    log.close()
    ckpt = run / "checkpoints" / iter_name(20)
    ckpt.mkdir(parents=True)
    os.utime(ckpt, (now - 90, now - 90))
    det = StragglerDetector(margin=0.25, windows=1)
    ranks = [
        RankWindow(rank=0, host="node-a", group=0, compute_s=0.05, reduce_s=0.04, step_s=0.1),
        RankWindow(rank=1, host="node-b", group=0, compute_s=0.09, reduce_s=0.002, step_s=0.1),
    ]
    settings = {"window_steps": 10, "margin": 0.25, "windows": 1, "policy": "none"}
    StragglerLog(run, settings).write(30, ranks, det.observe(30, ranks, first_step=21), det)
    return run


def test_top_once_shows_measured_beside_plan_checkpoint_and_stragglers(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    res = CliRunner().invoke(app, ["top", str(run), "--once"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"llmctl top  {run}  COMPLETED  ")
    assert lines[1].startswith("step        30/100 (30 %)   last step ")
    assert "loss 4.7000" in lines[1] and "ETA" not in lines[1]  # finished: no ETA
    assert lines[2] == "step time   0.110 s   plan 0.050 s   (2.20 x plan)"  # median of 30
    assert lines[3] == "tokens/s    5000   plan 10000   (0.50 x plan)"
    assert lines[4] == "MFU         10.0 %   plan 20.0 %   (0.50 x plan)"
    assert lines[5] == "memory      0.25 GiB   plan 0.50 GiB   (0.50 x plan)"
    assert lines[6].startswith("checkpoint  step 20, 1m3") and lines[6].endswith("s ago")
    strag = next(ln for ln in lines if ln.startswith("stragglers"))
    assert strag.startswith("stragglers  rank 1 on node-b (+80 %, since step 21)")
    assert "window 10 steps, margin 25 %, 1 windows; last window at step 30" in strag
    assert lines[-2:] == [
        "  rank    0 node-a           compute 0.050 s   reduce 0.040 s",
        "  rank    1 node-b           compute 0.090 s   reduce 0.002 s  slow",
    ]


def test_top_json_is_one_object_per_frame(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    res = CliRunner().invoke(app, ["top", str(run), "--once", "--json"])
    assert res.exit_code == 0, res.output
    (line,) = res.stdout.splitlines()
    got = json.loads(line)
    assert (got["state"], got["finished"], got["step"], got["total_steps"]) == (
        "COMPLETED", True, 30, 100,
    )  # fmt: skip
    assert got["predicted_step_s"] == 0.05 and abs(got["step_time_s"] - 0.11) < 1e-9
    assert got["checkpoint_step"] == 20 and 89 < got["checkpoint_age_s"] < 200
    assert 2 < got["last_step_age_s"] < 100
    assert [(s["rank"], s["host"]) for s in got["stragglers"]] == [(1, "node-b")]
    assert [r["rank"] for r in got["ranks"]] == [0, 1]


def test_top_of_a_run_without_steps_or_detector_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: tiny_cpu\n")
    write_launch(run, {"kind": "local", "run_dir": str(run), "pid": 1, "exit_code": 1})
    res = CliRunner().invoke(app, ["top", str(run), "--once"])
    assert res.exit_code == 0, res.output
    assert "FAILED" in res.stdout.splitlines()[0]
    assert "step        no step logged yet" in res.stdout
    assert "checkpoint  none committed" in res.stdout
    assert "stragglers  not measured" in res.stdout


def test_top_refuses_what_is_not_a_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a short path: the error box shortens a long one with "..."
    res = CliRunner().invoke(app, ["top", "nope", "--once"])
    assert res.exit_code != 0
    assert "neither a run directory nor a SLURM job id" in " ".join(res.output.split())


def test_top_refuses_a_too_short_interval(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["top", str(_run_dir(tmp_path)), "--interval", "0.1"])
    assert res.exit_code == 2
    assert "--interval must be >= 0.5 seconds, got 0.1" in " ".join(res.output.split())


def test_status_names_the_stragglers(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    res = CliRunner().invoke(app, ["status", str(run)])
    assert res.exit_code == 0, res.output
    assert "stragglers: rank 1 on node-b (+80 %, since step 21)" in res.stdout
    res = CliRunner().invoke(app, ["status", str(run), "--json"])
    assert [(s["rank"], s["host"]) for s in json.loads(res.stdout)["stragglers"]] == [(1, "node-b")]
