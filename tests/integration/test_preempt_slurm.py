"""Preemption on a real SLURM cluster: signalled mid-run, checkpointed, requeued, resumed.

`llmctl train launcher=slurm` submits a one-rank job. Mid-run the test sends the time-limit
notice the way SLURM does (`scancel --signal=USR1 --batch`): the batch shell asks the ranks to
stop, the rank checkpoints within the grace period and exits with 128+SIGTERM, the shell
requeues the job; `scontrol update StartTime=now` skips SLURM's requeue delay. The restarted
job resumes by itself and must end at the target step with the final loss of an uninterrupted
run of the same config (trained here in-process; bit-exact on CPU).
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
ITERS = 16
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


def test_preempted_job_requeues_and_finishes_like_uninterrupted(
    slurm_up: None, tmp_path: Path
) -> None:
    from llmctl.config import compose
    from llmctl.train import run_in_process

    corpus = make_corpus(tmp_path / "data" / "corpus")
    overrides = [*base_overrides(corpus, ITERS), "checkpoint.interval=10", "parallel.dp=1"]
    ref_dir = tmp_path / "reference"
    reference = run_in_process(compose("tiny_cpu", overrides), ref_dir)

    run_dir = tmp_path / "preempt_run"
    args = ["train", "recipe=tiny_cpu", "launcher=slurm", f"train.run_dir={run_dir}",
            "launcher.slurm_job_name=llmctl-ckpt-preempt-test", *overrides]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    job = str(json.loads(res.output)["job_id"])
    try:
        _until(lambda: len(losses(run_dir)) >= 5, 120, "the job to train 5 steps")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
        _until(lambda: _job_field(job, "JobState") == "PENDING", 90, "the requeue")
        assert int(_job_field(job, "Restarts") or 0) == 1
        # Restarting before the old step is gone gets "Job credential revoked": wait for it.
        _until(lambda: not _processes_of(run_dir), 60, "the first run's processes to exit")
        time.sleep(1.0)
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        _until(lambda: _job_field(job, "JobState") in _ENDED, 150, "the end")
    finally:
        subprocess.run(["scancel", job], check=False)
    out = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert _job_field(job, "JobState") in ("COMPLETED", ""), out[-3000:]
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "preempted by SIGTERM" in log, out[-3000:]
    resumed = [int(s) for s in re.findall(r"resumed from iter_(\d+)", log)]
    assert len(resumed) == 1 and 5 <= resumed[0] < ITERS
    got = losses(run_dir)
    assert max(got) == ITERS
    assert got[ITERS] == reference.losses[-1]  # same final loss as the uninterrupted run
