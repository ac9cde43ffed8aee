"""The processes of one run: marked, found, and ended with the run.

Every process a launcher starts carries `LLMCTL_RUN_TOKEN=<random>` in its environment, and
everything those processes start inherits it: torchrun, the ranks (each in its own session),
megatron's checkpoint Manager, forked writers, Python's resource tracker. After torchrun exits,
the launcher finds what is left by that token (`/proc/*/environ`, this host only) and ends it, so
no orphan holds the launcher's output pipe or the run directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

TOKEN_ENV = "LLMCTL_RUN_TOKEN"
_PROC = Path("/proc")


def new_token() -> str:
    """A fresh run token."""
    return uuid.uuid4().hex


def pids_with_token(token: str) -> list[int]:
    """PIDs of this host's processes whose environment carries `token` (not this process)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in _PROC.iterdir() if _PROC.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:  # gone, or not ours to read
            continue
        if state != "Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def end_processes(token: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process of the run still alive, SIGKILL what is left after `grace_s`.

    Returns:
        The PIDs that were still alive (empty when the run ended cleanly).
    """
    left = pids_with_token(token)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        alive = pids_with_token(token)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = pids_with_token(token)
        if not alive:
            break
    return left
