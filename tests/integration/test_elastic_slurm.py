"""Elastic SLURM jobs on the real one-node cluster: `--nodes=1-2` granted one node.

A DP2 run over two nodes is submitted with `launcher.elastic=true`; SLURM grants the one node it
has, and the batch script re-plans for it before srun (DP1, same global batch), records the
change and trains to the end. A grant below `launcher.min_nodes` is refused by the same entry
point (tests/unit/launch/test_elastic.py); losing a node of a running multi-node job cannot be
shown on one node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.launch.jobs import follow_logs

pytestmark = [pytest.mark.slurm, pytest.mark.multiproc, pytest.mark.slow]
runner = CliRunner()
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"


@pytest.fixture(scope="module")
def slurm_cluster() -> None:
    """The local cluster, brought up if needed and left running (as test_slurm_train.py)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm_local.sh runs the SLURM daemons as root")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("no SLURM client tools and no apt-get to install them")
    subprocess.run([SCRIPT, "up"], check=True, timeout=300)


def _submit(run_dir: Path, toy_prefix: str, *extra: str) -> None:
    args = ["train", "recipe=tiny_cpu", "launcher=slurm", "launcher.elastic=true", "--nodes", "2",
            "--dp", "2", f"train.run_dir={run_dir}", f"data.prefixes=[{toy_prefix}]",
            "train.eval_interval=0", "train.train_iters=4", "checkpoint.interval=2", "--json",
            *extra]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output


def test_job_granted_one_of_two_nodes_is_planned_for_it(
    slurm_cluster: None, toy_prefix: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    _submit(run, toy_prefix)
    assert "#SBATCH --nodes=1-2\n" in (run / "launch.sbatch").read_text()
    chunks: list[str] = []
    final = follow_logs(run, chunks.append, follow=True, poll_s=0.3, timeout_s=150)
    log = "".join(chunks)
    assert final is not None and final.state == "COMPLETED", log[-3000:]
    assert (
        "llmctl: elastic: SLURM granted 1 of 2 node(s); layout TP1 PP1 CP1 DP2 MBS4 rc=none "
        "opt=none -> TP1 PP1 CP1 DP1 MBS4 rc=none opt=none on 1 node(s)"
    ) in log
    record = json.loads((run / "launch.json").read_text())
    (change,) = record["layout_changes"]
    assert (change["old_layout"]["dp"], change["new_layout"]["dp"]) == (2, 1)
    assert change["new_layout"]["global_batch_size"] == 8 and change["new_grad_accumulation"] == 2
    assert record["exit_code"] == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("event") for r in lines] == ["layout_change", None, None, None, None]
    assert [r["step"] for r in lines[1:]] == [1, 2, 3, 4]
    assert not (run / "logs" / "rank1.log").exists()  # one rank: the planner's DP1
    # `llmctl status` shows the layout it runs at and the one it was submitted at.
    status = json.loads(runner.invoke(app, ["status", str(run), "--json"]).output)
    assert status["layout"]["current"] == "TP1 PP1 CP1 DP1 MBS4 rc=none opt=none"
    assert status["layout"]["original"] == "TP1 PP1 CP1 DP2 MBS4 rc=none opt=none"
    assert status["layout"]["changes"] == 1
    assert status["layout"]["last_change"]["reason"] == "SLURM granted 1 of 2 node(s)"
    text = " ".join(runner.invoke(app, ["status", str(run)]).output.split())
    assert (
        "layout TP1 PP1 CP1 DP1 MBS4 rc=none opt=none (started as TP1 PP1 CP1 DP2 MBS4 rc=none "
        "opt=none; 1 elastic change(s), last: SLURM granted 1 of 2 node(s))"
    ) in text
