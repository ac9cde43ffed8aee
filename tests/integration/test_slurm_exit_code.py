"""A SLURM job ends with its rank's exit code, not torchrun's 1 (real local cluster).

The job is submitted held (`#SBATCH --hold`); before it is released its run directory's
`checkpoints/` is made a read-only bind mount, so the first save fails with the kernel's EROFS
and, with `checkpoint.max_failed_saves=1`, the rank stops through the failed-save policy with
exit code 3. torchrun exits 1 whatever its workers' codes; the oracle is SLURM's own record of
the job (`scontrol show job`: ExitCode=3:0, the field `sacct -o ExitCode` reports where
accounting is configured; this cluster has no slurmdbd).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from slurm_support import wait_finished
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"
runner = CliRunner()


@pytest.fixture
def slurm_up() -> None:
    """The local one-node cluster (idempotent `up`; left running for other tests)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root: SLURM daemons and a read-only bind mount")
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        pytest.skip("no SLURM client tools and no apt-get to install them")
    subprocess.run([str(SCRIPT), "up"], check=True, timeout=300, capture_output=True)


def _read_only(path: Path) -> None:
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)


def test_failed_save_policy_stop_is_the_jobs_exit_code(
    slurm_up: None, toy_prefix: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "recipe=tiny_cpu", "launcher=slurm", f"train.run_dir={run_dir}",
            f"data.prefixes=[{toy_prefix}]", "train.train_iters=6", "train.eval_interval=0",
            "checkpoint.interval=2", "checkpoint.save_retries=0", "checkpoint.max_failed_saves=1",
            "launcher.slurm_extra=[--hold]", "--json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    job_id = str(json.loads(res.output)["job_id"])
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    mounted = False
    try:
        _read_only(ckpt)
        mounted = True
        subprocess.run(["scontrol", "release", job_id], check=True)
        state = wait_finished(job_id, 240)
        job = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True
        ).stdout
    finally:
        subprocess.run(["scancel", job_id], check=False)
        if mounted:
            subprocess.run(["umount", str(ckpt)], check=False)
    out = (run_dir / f"slurm-{job_id}.out").read_text()
    assert state == "FAILED", out[-3000:]
    assert re.search(r"\bExitCode=3:0\b", job), (job, out[-3000:])
    stop = "llmctl: rank 0 exits 3: stopping: 1 consecutive checkpoint saves failed"
    assert re.search(rf"{stop} .*; there is no complete checkpoint; fix the storage", out), out
    assert "Read-only file system" in out, out[-3000:]
    assert json.loads((run_dir / "launch.json").read_text())["exit_code"] == 3
    status = runner.invoke(app, ["status", str(run_dir), "--json"])
    assert json.loads(status.output)["exit_code"] == "3:0", status.output
    assert not list(ckpt.iterdir())  # nothing written under the read-only mount
