"""Placement from the plan on a real multi-node SLURM cluster with a switch topology.

The three-node netns cluster of slurm_netns.py (leaf0: h0, h1; leaf1: h2). A two-node run with
`cluster.nodes_per_switch=2` asks for `--switches=1`:

- with h0 and h1 free, SLURM places it under leaf0, the batch shell's check agrees and the
  two ranks (one per node, over the bridge) train to the end;
- with h1 drained, the only two free nodes straddle both leaves: SLURM holds the job
  (PENDING) for max_switch_wait, then starts it spread, and the check stops it in one line
  with exit 2 before any rank starts; `launcher.placement=warn` runs it with that line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from slurm_netns import scontrol
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.launch.jobs import follow_logs

pytestmark = [pytest.mark.slurm, pytest.mark.multiproc, pytest.mark.slow, pytest.mark.netns]
runner = CliRunner()


def _submit(run_dir: Path, toy_prefix: str, *extra: str) -> str:
    args = ["train", "recipe=tiny_cpu", "launcher=slurm", "cluster.num_nodes=2", "--dp", "2",
            "cluster.nodes_per_switch=2", f"train.run_dir={run_dir}", "train.train_iters=3",
            f"data.prefixes=[{toy_prefix}]", "train.eval_interval=0", "--json", *extra]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return str(json.loads(res.output)["job_id"])


def _log(run_dir: Path, timeout_s: float) -> tuple[str, str]:
    chunks: list[str] = []
    final = follow_logs(run_dir, chunks.append, follow=True, poll_s=0.3, timeout_s=timeout_s)
    assert final is not None, "".join(chunks)[-3000:]
    return final.state, "".join(chunks)


def test_a_job_placed_as_planned_trains_on_two_nodes_of_one_leaf(
    netns_slurm: str, toy_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", netns_slurm)
    run_dir = tmp_path / "run"
    _submit(run_dir, toy_prefix)
    assert "#SBATCH --switches=1\n" in (run_dir / "launch.sbatch").read_text()
    state, log = _log(run_dir, 240)
    assert state == "COMPLETED", log[-3000:]
    assert "on h[0-1], rendezvous h0:" in log, log[-3000:]
    assert "llmctl: placement: 2 node(s) under 1 leaf switch (leaf0)" in log, log[-3000:]
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert (run_dir / "logs" / "rank1.log").is_file()


def test_a_spread_allocation_waits_then_stops_before_any_rank(
    netns_slurm: str, toy_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", netns_slurm)
    scontrol("update", "NodeName=h1", "State=DRAIN", "Reason=llmctl-test")
    try:
        run_dir = tmp_path / "strict"
        job = _submit(run_dir, toy_prefix)
        time.sleep(2)
        held = scontrol("show", "job", job)
        assert "JobState=PENDING" in held, held  # h0 and h2 are idle: SLURM holds it
        state, log = _log(run_dir, 240)
        assert state == "FAILED", log[-3000:]
        line = (
            "llmctl: placement: 2 node(s) span 2 leaf switches (leaf0, leaf1); the plan "
            "assumed 1; not starting (launcher.placement=warn runs anyway)"
        )
        assert line in log, log[-3000:]
        assert not (run_dir / "logs" / "rank0.log").exists()  # no rank started
        status = json.loads(runner.invoke(app, ["status", str(run_dir), "--json"]).output)
        assert status["exit_code"] == "2:0", status  # SLURM ExitCode: the code the script recorded

        warned = tmp_path / "warn"
        _submit(warned, toy_prefix, "launcher.placement=warn")
        state, log = _log(warned, 240)
        assert state == "COMPLETED", log[-3000:]
        assert "on h[0,2]" in log and "running anyway (launcher.placement=warn)" in log
    finally:
        scontrol("update", "NodeName=h1", "State=RESUME")
