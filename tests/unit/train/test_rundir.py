from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from llmctl.config import cfg_to_yaml, compose, load_resolved
from llmctl.plan import Layout, PlanRecord
from llmctl.run.rundir import create_run_dir, default_run_dir, read_plan


def test_create_run_dir_round_trips_config_and_plan(tmp_path):
    cfg = compose("tiny_cpu", [f"train.run_dir={tmp_path / 'r'}", "train.lr=1e-3"])
    plan = PlanRecord(
        layout=Layout(tp=1),
        layout_name=Layout(tp=1).short(),
        fits=True,
        peak_mem_gib=1.0,
        usable_gib=2.0,
        memory_gib={"weights": 1.0},
        step_time_s=0.5,
        tokens_per_s=10.0,
        mfu=0.1,
    )
    run_dir = create_run_dir(cfg, plan)
    assert run_dir == tmp_path / "r"
    assert (run_dir / "logs").is_dir() and (run_dir / "checkpoints").is_dir()
    assert cfg_to_yaml(load_resolved(run_dir / "config.yaml")) == cfg_to_yaml(cfg)
    assert read_plan(run_dir) == plan


def test_default_run_dir_is_recipe_and_utc_stamp(tmp_path, monkeypatch):
    now = datetime(2026, 11, 30, 4, 15, 0, tzinfo=UTC)
    assert default_run_dir("tiny_cpu", now) == Path("runs/tiny_cpu-20261130T041500Z")
    monkeypatch.chdir(tmp_path)
    cfg = compose("tiny_cpu", [])
    run_dir = create_run_dir(cfg, None)
    assert run_dir.parent == Path("runs") and run_dir.name.startswith("tiny_cpu-")
    assert cfg.train.run_dir == str(run_dir)
    assert json.loads((run_dir / "plan.json").read_text()) == {}
