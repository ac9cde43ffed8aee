"""Elastic re-plan: its config checks, the SLURM rendering, and the re-plan at a job's start.

The ssh launcher's re-plan on a real host loss is tests/integration/test_elastic_replan.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmctl.errors import UserError
from llmctl.launch.elastic import check_elastic, replan_granted
from llmctl.launch.slurm import render_sbatch

Make = Callable[..., Any]
RUN_DIR = "/runs/golden run"
ELASTIC = ("launcher.elastic=true", "cluster.num_nodes=2", "parallel.dp=2", "checkpoint.interval=2")


def test_sbatch_asks_for_a_node_range_and_replans_before_srun(
    make_cfg: Make, golden: Callable[[str, str], None]
) -> None:
    text = render_sbatch(make_cfg("launcher=slurm", *ELASTIC), RUN_DIR)
    golden("slurm_elastic_2nodes.sbatch", text)
    assert "#SBATCH --nodes=1-2\n" in text
    replan = text.index(
        "-m llmctl.launch.elastic replan '/runs/golden run' \"$SLURM_JOB_NUM_NODES\""
    )
    assert replan < text.index("srun --kill-on-bad-exit=1")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    fixed = render_sbatch(make_cfg("launcher=slurm", *ELASTIC, "launcher.min_nodes=2"), RUN_DIR)
    assert "#SBATCH --nodes=2\n" in fixed  # min = max: a plain count
    plain = render_sbatch(
        make_cfg("launcher=slurm", "cluster.num_nodes=2", "parallel.dp=2"), RUN_DIR
    )
    assert "#SBATCH --nodes=2\n" in plain and "llmctl.launch.elastic" not in plain
    # Growth back: only a job that can run on fewer nodes and requeue itself watches for more.
    assert "kill -USR1 $$" in text and "grow back to 2 node(s)" in text
    assert "Elastic growth" not in fixed and "Elastic growth" not in plain
    no_requeue = ("launcher=slurm", *ELASTIC, "launcher.slurm_requeue=false")
    assert "Elastic growth" not in render_sbatch(make_cfg(*no_requeue), RUN_DIR)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("launcher=local",), "launcher.elastic=true needs launcher=torchrun or launcher=slurm"),
        (("launcher=torchrun", "launcher.max_restarts=1"), "set launcher.max_restarts=0"),
        (("launcher=torchrun", "checkpoint.interval=0"), "set checkpoint.interval >= 1"),
        (("launcher=slurm", "launcher.min_nodes=3"), "launcher.min_nodes must be in 1..cluster"),
        (("launcher=slurm", "launcher.elastic_batch=scale"), "elastic_batch must be keep_global"),
        (("launcher=torchrun", "launcher.elastic_probe_s=0"), "elastic_probe_s must be > 0"),
    ],
)
def test_elastic_values_are_refused_in_one_line(
    make_cfg: Make, overrides: tuple[str, ...], message: str
) -> None:
    cfg = make_cfg(*ELASTIC, *overrides)
    if "launcher=local" in overrides:
        cfg.cluster.num_nodes = 2
    with pytest.raises(UserError, match=message.replace(".", r"\.")) as err:
        check_elastic(cfg)
    assert "\n" not in err.value.message


def _submitted_run(tmp_path: Path) -> Path:
    """A SLURM elastic run directory as `llmctl train` leaves it at submission (no checkpoint)."""
    from llmctl.launch.api import prepare_train, write_launch
    from llmctl.run.rundir import create_run_dir

    run = tmp_path / "run"
    launch = prepare_train(
        "tiny_cpu", ["launcher=slurm", *ELASTIC, f"train.run_dir={run}", "train.train_iters=8"]
    )
    create_run_dir(launch.cfg, launch.plan)
    write_launch(run, {"kind": "slurm", "run_dir": str(run)})
    return run


def test_a_job_granted_fewer_nodes_is_planned_for_them_and_back(tmp_path: Path) -> None:
    from llmctl.config import load_resolved

    run = _submitted_run(tmp_path)
    assert replan_granted(run, 2) is None  # granted what it asked: nothing changes
    out = subprocess.run(
        [sys.executable, "-m", "llmctl.launch.elastic", "replan", str(run), "1"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "SLURM_JOB_NODELIST": "n7"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("llmctl: elastic:")]
    assert lines == [
        "llmctl: elastic: SLURM granted 1 of 2 node(s); layout TP1 PP1 CP1 DP2 MBS4 rc=none "
        "opt=none -> TP1 PP1 CP1 DP1 MBS4 rc=none opt=none on 1 node(s) (n7), global batch 8 "
        "kept (gradient accumulation 1 -> 2); starting at step 1"
    ], out.stderr
    cfg = load_resolved(run / "config.yaml")
    assert (cfg.cluster.num_nodes, cfg.parallel.dp, cfg.train.global_batch_size) == (1, None, 8)
    assert json.loads((run / "plan.json").read_text())["layout"]["dp"] == 1
    record = json.loads((run / "launch.json").read_text())
    assert record["elastic_original"] == {"num_nodes": 2, "dp": 2}
    (change,) = record["layout_changes"]
    assert (change["old_layout"]["dp"], change["new_layout"]["dp"]) == (2, 1)
    events = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["layout_change"]

    back = replan_granted(run, 2)  # the next (re)start gets both nodes: the original layout
    assert back is not None and back["new_layout"]["dp"] == 2
    cfg = load_resolved(run / "config.yaml")
    assert (cfg.cluster.num_nodes, cfg.parallel.dp) == (2, 2)
    assert len(json.loads((run / "launch.json").read_text())["layout_changes"]) == 2


def test_a_job_granted_fewer_than_min_nodes_stops_in_one_line(tmp_path: Path) -> None:
    run = _submitted_run(tmp_path)
    text = (run / "config.yaml").read_text().replace("min_nodes: 1", "min_nodes: 2")
    (run / "config.yaml").write_text(text)
    before = (run / "plan.json").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "llmctl.launch.elastic", "replan", str(run), "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "llmctl: elastic: the job was granted 1 node(s) but launcher.min_nodes=2: missing 1 node(s)"
    )
    assert (run / "plan.json").read_text() == before


def test_a_restart_after_a_node_loss_names_the_node_and_settles_the_seconds_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A requeued job granted fewer nodes than its last start: the reason names the restart
    and the node not granted again; the node wrapper's exit record measures the seconds lost
    from metrics.jsonl (last step before the change -> first step at the new layout)."""
    from llmctl.launch.node import record_exit

    run = _submitted_run(tmp_path)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n6,n7")
    assert replan_granted(run, 2) is None  # first start, both nodes: only the nodes are noted
    assert json.loads((run / "launch.json").read_text())["slurm_nodes"] == ["n6", "n7"]
    with (run / "metrics.jsonl").open("a") as f:
        for step, t in [(4, 100.0), (5, 101.5)]:
            f.write(json.dumps({"step": step, "loss": 1.0, "time": t}) + "\n")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n6")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    rec = replan_granted(run, 1, out=open(os.devnull, "w"))  # noqa: SIM115
    assert rec is not None
    assert rec["reason"] == "SLURM restart 1 granted 1 of 2 node(s) (n7 not granted again)"
    assert (rec["hosts"], rec["lost_hosts"], rec["seconds_lost"]) == (["n6"], ["n7"], None)
    at = rec["relaunched_at"]
    record = json.loads((run / "launch.json").read_text())
    record["layout_changes"][0]["from_step"] = 4  # as if resumed from a step-4 checkpoint
    (run / "launch.json").write_text(json.dumps(record))
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 5, "loss": 1.0, "time": at + 7.25}) + "\n")  # resumed
    record_exit(run, 0)
    (change,) = json.loads((run / "launch.json").read_text())["layout_changes"]
    assert change["first_step_at"] == at + 7.25
    assert change["seconds_lost"] == pytest.approx(at + 7.25 - 101.5, abs=1e-3)


def test_growth_waits_for_a_checkpoint_newer_than_the_resumed_one(tmp_path: Path) -> None:
    from llmctl.launch.elastic import grow_ready

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "launch.json").write_text(json.dumps({"layout_changes": [{"from_step": 4}]}))
    assert not grow_ready(run)  # no checkpoint at all
    (run / "checkpoints" / "latest").write_text("4\n")
    assert not grow_ready(run)  # only the one the shrunk run resumed from
    (run / "checkpoints" / "latest").write_text("6\n")
    assert grow_ready(run)
    rc = subprocess.run(
        [sys.executable, "-m", "llmctl.launch.elastic", "grow-ready", str(run)], timeout=60
    ).returncode
    assert rc == 0
