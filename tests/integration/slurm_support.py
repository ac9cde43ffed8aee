"""The local SLURM cluster as the data tests use it: is it up, and wait for a job to end."""

from __future__ import annotations

import shutil
import subprocess
import time


def cluster_up() -> bool:
    """`sinfo` answers and shows a usable node."""
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    return out.returncode == 0 and any(s in ("idle", "mix", "alloc") for s in out.stdout.split())


def wait_finished(job_id: str, timeout_s: float) -> str:
    """Poll scontrol until the job leaves the queue or finishes; return its last state.

    Raises:
        AssertionError: still queued or running after `timeout_s` (the job is cancelled).
    """
    state, deadline = "UNKNOWN", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True)
        if out.returncode != 0:
            return state
        state = out.stdout.split("JobState=")[1].split()[0]
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], capture_output=True)
    raise AssertionError(f"job {job_id} still {state} after {timeout_s} s")
