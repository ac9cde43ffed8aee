"""`llmctl train launcher=slurm` on a real one-node SLURM cluster (scripts/slurm_local.sh).

Real daemons, real sbatch/srun/scontrol, real torchrun and megatron-core: a 2-rank job trains
the tiny model to the end and its metrics land in the run directory; a USR1 time-limit notice
reaches the batch shell, which stops the ranks and requeues the job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.launch.jobs import follow_logs, run_status

pytestmark = [pytest.mark.slurm, pytest.mark.multiproc, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
runner = CliRunner()


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The local cluster, brought up if needed (idempotent).

    It is left running: other test sessions may share it, and `up` on a running cluster costs
    0.02 s. Stop it with `scripts/slurm_local.sh down`.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm_local.sh runs the SLURM daemons as root")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("no SLURM client tools and no apt-get to install them")
    subprocess.run([SCRIPT, "up"], check=True, timeout=300)


def _submit(run_dir: Path, toy_prefix: str, *extra: str) -> str:
    args = ["train", "recipe=tiny_cpu", "launcher=slurm", "--dp", "2", f"train.run_dir={run_dir}",
            f"data.prefixes=[{toy_prefix}]", "train.eval_interval=0", "--json", *extra]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return str(json.loads(res.output)["job_id"])


def test_slurm_job_trains_two_ranks_to_the_end(
    slurm_cluster: None, toy_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMCTL_TEST_SECRET", "v4lue-never-written")
    run_dir = tmp_path / "run"
    job_id = _submit(
        run_dir, toy_prefix, "train.train_iters=3", "launcher.secrets=[LLMCTL_TEST_SECRET]"
    )
    chunks: list[str] = []
    final = follow_logs(run_dir, chunks.append, follow=True, poll_s=0.3, timeout_s=150)
    log = "".join(chunks)
    assert final is not None and final.state == "COMPLETED", log[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["loss"] > 0 for s in steps)
    assert (run_dir / "logs" / "rank1.log").is_file()  # two ranks ran
    assert f"llmctl: job {job_id} (restart 0)" in log
    # The secret reached the job by name (the script warns when it is missing), never by value.
    assert "secret LLMCTL_TEST_SECRET is not set" not in log
    assert "v4lue-never-written" not in (run_dir / "launch.sbatch").read_text()
    by_id = run_status(job_id)  # the job id alone finds the run dir through WorkDir
    assert by_id.state == "COMPLETED" and by_id.run_dir == str(run_dir) and by_id.step == 3
    status = json.loads(runner.invoke(app, ["status", str(run_dir), "--json"]).output)
    assert status["state"] == "COMPLETED"
    assert status["reason"] is None, status  # scontrol's Reason=None is no reason: JSON null


def test_slurm_job_pushes_its_metrics_to_a_real_pushgateway(
    slurm_cluster: None, toy_prefix: str, tmp_path: Path
) -> None:
    """A batch job no server scrapes: each rank pushes to the Pushgateway while it trains and
    once at the end, with its run, rank and host labels (issue 19: metrics of SLURM jobs)."""
    import socket

    from prom_support import free_ports, http_get, pushgateway

    run_dir = tmp_path / "run"
    (port,) = free_ports(1)
    with pushgateway(tmp_path, port) as gateway:
        push = [f"train.metrics.pushgateway={gateway}", "train.metrics.push_interval_s=1"]
        _submit(run_dir, toy_prefix, "train.train_iters=6", "checkpoint.interval=3", *push)
        final = follow_logs(run_dir, lambda _t: None, follow=True, poll_s=0.3, timeout_s=180)
        assert final is not None and final.state == "COMPLETED"
        text = http_get(f"{gateway}/metrics").decode()
    steps = {}
    for line in text.splitlines():
        if line.startswith("llmctl_train_step{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")]
                          .replace('"', "").split(","))  # fmt: skip
            steps[labels["rank"]] = (labels, float(line.rsplit(" ", 1)[1]))
    assert sorted(steps) == ["0", "1"], text[-2000:]
    for labels, value in steps.values():
        assert value == 6  # the final push, after the last step
        assert labels["job"] == "llmctl" and labels["run"] == "run"
        assert labels["host"] == socket.gethostname()
    saves = [x for x in text.splitlines() if x.startswith("llmctl_checkpoint_saves_total{")]
    assert any('rank="0"' in x and x.endswith(" 2") for x in saves), saves


def test_time_limit_signal_stops_ranks_and_requeues(
    slurm_cluster: None, toy_prefix: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    job_id = _submit(run_dir, toy_prefix, "train.train_iters=100000")
    metrics, out = run_dir / "metrics.jsonl", run_dir / f"slurm-{job_id}.out"
    try:
        _wait(lambda: metrics.is_file() and metrics.stat().st_size > 0, 120, "first step")
        # What --signal=B:USR1@90 does before the time limit, sent now.
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
        _wait(lambda: "requeueing job" in out.read_text(), 90, "requeue")
        text = out.read_text()
        assert "caught SIGUSR1: asking the ranks to checkpoint and exit" in text
        # torchrun got SIGTERM and shut its workers down gracefully (it gives them 30 s);
        # signalling srun instead would have cancelled the step at once ("forcing job
        # termination", task Killed).
        assert "death signal, shutting down workers" in text
        assert "forcing job termination" not in text
        _wait(lambda: (run_status(job_id).restarts or 0) >= 1, 30, "Restarts >= 1")
    finally:
        subprocess.run(["scancel", job_id], check=False)


def _wait(cond: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
