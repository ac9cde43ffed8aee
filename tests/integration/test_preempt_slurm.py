"""Preemption on a real SLURM cluster: signalled mid-run, checkpointed, requeued, resumed.

`llmctl train launcher=slurm` submits a one-rank job. Mid-run the test sends the time-limit
notice the way SLURM does (`scancel --signal=USR1 --batch`): the batch shell asks the ranks to
stop, the rank checkpoints the step it is in and exits with 128+SIGTERM, the shell requeues the
job; `scontrol update StartTime=now` skips SLURM's requeue delay. Later `scontrol requeue`
signals every process of the job (SIGTERM), megatron's checkpoint Manager included. Both times
the restarted job must resume from the checkpoint of the step the signal arrived in: every
step appears exactly once in metrics.jsonl (zero steps redone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from ckpt_support import base_overrides, losses, make_corpus
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"
ITERS = 100  # steps left after each notice: a fast host must not finish before the next one
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "")


@pytest.fixture(scope="module")
def slurm_up() -> None:
    """The local one-node cluster (idempotent `up`; left running for other tests)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: scripts/slurm_local.sh runs the SLURM daemons as root")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("no SLURM client tools and no apt-get to install them")
    subprocess.run([str(SCRIPT), "up"], check=True, timeout=300, capture_output=True)


def _job_field(job_id: str, name: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=False
    ).stdout
    m = re.search(rf"\b{name}=(\S+)", out)
    return m.group(1) if m else ""


def _processes_of(run_dir: Path) -> list[int]:
    import psutil

    pids = []
    for p in psutil.process_iter(["cmdline"]):
        if str(run_dir) in " ".join(p.info["cmdline"] or []):
            pids.append(p.pid)
    return pids


def _until(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _preempt_and_restart(job: str, run_dir: Path, send: list[str], restarts: int) -> int:
    """Send a preemption (`send`), wait for the requeue and the old processes to end, restart.

    Returns:
        The last step the preempted run trained.
    """
    subprocess.run(send, check=True)
    _until(lambda: _job_field(job, "JobState") == "PENDING", 120, "the requeue")
    assert int(_job_field(job, "Restarts") or 0) == restarts
    # Restarting before the old step is gone gets "Job credential revoked": wait for it.
    _until(lambda: not _processes_of(run_dir), 60, "the preempted run's processes to exit")
    last = max(losses(run_dir))
    time.sleep(1.0)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    return last


def _metric_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [int(json.loads(line)["step"]) for line in lines if line.strip()]


def test_preemptions_checkpoint_the_current_step_and_requeued_job_redoes_none(
    slurm_up: None, tmp_path: Path
) -> None:
    """Time-limit notice (USR1 to the batch shell), then `scontrol requeue` (SIGTERM to all).

    Each time the rank saves the step it was in, exits 128+SIGTERM, and the requeued job
    resumes from exactly that checkpoint: every step appears once in metrics.jsonl.
    """
    corpus = make_corpus(tmp_path / "data" / "corpus")
    overrides = [*base_overrides(corpus, ITERS), "checkpoint.interval=5", "parallel.dp=1"]
    run_dir = tmp_path / "preempt_run"
    args = ["train", "recipe=tiny_cpu", "launcher=slurm", f"train.run_dir={run_dir}",
            "launcher.slurm_job_name=llmctl-ckpt-preempt-test", *overrides]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    job = str(json.loads(res.output)["job_id"])
    stops = []
    try:
        _until(lambda: len(losses(run_dir)) >= 7, 180, "the job to train 7 steps")
        usr1 = ["scancel", "--signal=USR1", "--batch", job]
        stops.append(_preempt_and_restart(job, run_dir, usr1, 1))
        _until(lambda: max(losses(run_dir)) >= stops[0] + 3, 180, "3 steps after the restart")
        stops.append(_preempt_and_restart(job, run_dir, ["scontrol", "requeue", job], 2))
        _until(lambda: _job_field(job, "JobState") in _ENDED, 240, "the end")
    finally:
        subprocess.run(["scancel", job], check=False)
    out = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert _job_field(job, "JobState") in ("COMPLETED", ""), out[-3000:]
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert log.count("preempted by SIGTERM") == 2, out[-3000:]
    assert "failed" not in log.lower(), log[-3000:]
    resumed = [int(s) for s in re.findall(r"resumed from iter_(\d+)", log)]
    # The checkpoint of the step each preemption arrived in was committed and resumed from,
    # although the periodic interval (5) would have left older ones: zero steps redone.
    assert resumed == stops, (resumed, stops, out[-3000:])
    assert _metric_steps(run_dir) == list(range(1, ITERS + 1))
