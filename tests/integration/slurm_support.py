"""The local SLURM cluster as the data tests use it: is it up, and wait for a job to end."""

from __future__ import annotations

import shutil
import subprocess
import time

USABLE = ("idle", "mix", "alloc", "comp")  # "comp": a previous test's job is still ending


def cluster_up(wait_s: float = 60.0) -> bool:
    """`sinfo` answers and shows a usable node within `wait_s`.

    A node of the local cluster can be briefly unusable while SLURM cleans up after another
    test; on a loaded host that takes seconds, and a single look would then skip the test
    instead of running it.
    """
    if shutil.which("sinfo") is None:
        return False
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
        if out.returncode != 0:  # no controller answering: no cluster here
            return False
        if any(s in USABLE for s in out.stdout.split()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)


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
