"""A node lost from a running multi-node SLURM job: SLURM requeues it, llmctl re-plans it.

On the three-node netns cluster of slurm_netns.py, with h2 drained, a DP2 elastic job
(`launcher.elastic=true`, `--nodes=1-2`) starts on h0 and h1. After a committed checkpoint, h1
crashes (`slurm_local.sh crash-node h1`: every process in its namespace SIGKILLed, slurmd
included, and its link cut). Nothing of llmctl runs on h1 any more and nothing is told:

- slurmctld finds h1 silent (SlurmdTimeout 10 s), sets it DOWN, cancels the step and requeues
  the job (`--requeue`);
- SLURM holds a requeued job for the job credential's lifetime + 1 s before it may start
  again (121 s by default; the test cluster's credentials live 10 s: an 11 s hold);
- the restart is granted h0 alone; the batch shell's re-plan gives DP1 (global batch kept, two
  micro-batches), resumes from the newest committed checkpoint and trains to the end.

Then h1 is restored (ReturnToService=2 puts it back in service): the shrunk job's growth watch
sees an idle node, the ranks checkpoint, the job requeues itself, and the restart on h0 and h1
is re-planned back to DP2 and trains to the end. Every step is logged once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from slurm_netns import cluster, job_field, scontrol
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.launch.jobs import TERMINAL, follow_logs, run_status
from llmctl.run import ckpt_store as store

pytestmark = [pytest.mark.slurm, pytest.mark.multiproc, pytest.mark.slow, pytest.mark.netns]
runner = CliRunner()
ITERS = 24


def _wait(what: str, ok: object, timeout_s: float, poll_s: float = 0.5) -> None:
    assert callable(ok)
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(poll_s)


def _changes(run: Path) -> list[dict[str, object]]:
    try:
        return list(json.loads((run / "launch.json").read_text()).get("layout_changes", []))
    except (OSError, ValueError):
        return []


def _first_step_after(run: Path) -> bool:
    """Whether the run re-planned by the (first) layout change has logged a step (past the
    step it resumed from, after its relaunch: steps the lost run logged do not count)."""
    change = _changes(run)[0]
    step, since = int(change["from_step"]), float(change["relaunched_at"])  # type: ignore[arg-type]
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line being written
        if "event" not in rec and rec["step"] > step and rec["time"] >= since:
            return True
    return False


def _node_state(node: str) -> str:
    return next(w for w in scontrol("show", "node", node).split() if w.startswith("State="))


def test_a_node_lost_mid_run_is_requeued_and_replanned_on_the_nodes_left(
    netns_slurm: str, toy_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", netns_slurm)
    run = tmp_path / "run"
    scontrol("update", "NodeName=h2", "State=DRAIN", "Reason=llmctl-test")
    try:
        args = ["train", "recipe=tiny_cpu", "launcher=slurm", "launcher.elastic=true",
                "--nodes", "2", "--dp", "2", f"train.run_dir={run}", "train.eval_interval=0",
                f"data.prefixes=[{toy_prefix}]", f"train.train_iters={ITERS}",
                "checkpoint.interval=2", "launcher.elastic_probe_s=2", "--json"]  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        job = str(json.loads(res.output)["job_id"])
        sbatch = (run / "launch.sbatch").read_text()
        assert (
            "#SBATCH --nodes=1-2\n" in sbatch
            and "--ntasks-per-node" not in sbatch.split("set -uo")[0]
        )  # no task count in the header: SLURM grants both free nodes, not the minimum
        ckpts = run / "checkpoints"
        _wait("a committed checkpoint", lambda: store.committed_steps(ckpts), 180)
        assert job_field(job, "NodeList") == "h[0-1]"
        crash_at = time.time()
        cluster("crash-node", "h1")
        newest_at_crash = max(store.committed_steps(ckpts))

        # slurmctld notices, cancels and requeues. What `llmctl status`/`logs --follow` read
        # meanwhile must never look like the job's end.
        seen: set[str] = set()

        def requeued() -> bool:
            seen.add(run_status(str(run)).state)
            return job_field(job, "Restarts") == "1"

        _wait("the requeue", requeued, 120)
        assert not seen & TERMINAL, seen
        assert _node_state("h1").startswith("State=DOWN"), _node_state("h1")
        _wait("a step at DP1", lambda: _changes(run) and _first_step_after(run), 180)

        # h1 comes back: the shrunk job sees an idle node, checkpoints and requeues itself.
        cluster("restore-node", "h1")
        _wait("the second requeue", lambda: job_field(job, "Restarts") == "2", 180)
        chunks: list[str] = []
        final = follow_logs(run, chunks.append, follow=True, poll_s=0.5, timeout_s=300)
        log = "".join(chunks)
        assert final is not None and final.state == "COMPLETED", log[-3000:]
        log = (run / f"slurm-{job}.out").read_text()  # every start's output (--open-mode=append)
    finally:
        cluster("restore-node", "h1", check=False)
        scontrol("update", "NodeName=h2", "State=RESUME")

    assert "Node failure on h1" in log or "DUE TO NODE FAILURE" in log, log[-3000:]
    record = json.loads((run / "launch.json").read_text())
    change, grow = record["layout_changes"]
    step = change["from_step"]
    assert step >= newest_at_crash, (step, newest_at_crash)  # the newest committed one
    line = (
        "llmctl: elastic: SLURM restart 1 granted 1 of 2 node(s) (h1 not granted again); layout "
        "TP1 PP1 CP1 DP2 MBS4 rc=none opt=none -> TP1 PP1 CP1 DP1 MBS4 rc=none opt=none on 1 "
        f"node(s) (h0), global batch 8 kept (gradient accumulation 1 -> 2); resuming from step "
        f"{step}"
    )
    assert line in log, log[-3000:]
    print(line)
    assert (change["hosts"], change["lost_hosts"]) == (["h0"], ["h1"])
    assert record["exit_code"] == 0 and record["slurm_restart"] == 2
    assert (
        "llmctl: elastic: 1 node(s) idle in partition local; checkpointing to grow back to 2 "
        "node(s)" in log
    ), log[-3000:]
    assert grow["reason"] == "SLURM restart 2 granted 2 of 2 node(s)", grow
    assert (grow["old_layout"]["dp"], grow["new_layout"]["dp"]) == (1, 2)
    assert grow["hosts"] == ["h0", "h1"] and grow["from_step"] > step
    assert grow["new_layout"] == change["old_layout"]
    lost = change["seconds_lost"]
    assert isinstance(lost, float) and 0 < lost < time.time() - crash_at + 60, change
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    events = [m for m in metrics if "event" in m]
    assert [(e["event"], e["from_step"]) for e in events] == [
        ("layout_change", step), ("layout_change", grow["from_step"])
    ]  # fmt: skip
    steps = [m["step"] for m in metrics if "event" not in m]
    assert steps == list(range(1, ITERS + 1)), steps  # every step once, none lost or repeated
    assert metrics.index(events[0]) == step  # the change sits right after the resumed step
    status = json.loads(runner.invoke(app, ["status", str(run), "--json"]).output)
    assert status["layout"]["current"] == "TP1 PP1 CP1 DP2 MBS4 rc=none opt=none"
    assert status["layout"]["original"] == "TP1 PP1 CP1 DP2 MBS4 rc=none opt=none"
    assert status["layout"]["changes"] == 2
    text = " ".join(runner.invoke(app, ["status", str(run)]).output.split())
    assert "2 elastic change(s), last: SLURM restart 2 granted 2 of 2 node(s)" in text, text
    _wait("h1 back in service", lambda: "IDLE" in _node_state("h1"), 60)
    print(f"seconds lost (11 s requeue hold): shrink {lost:.1f}, grow {grow['seconds_lost']}")
