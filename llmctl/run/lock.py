"""One trainer per run directory: `flock` locks that live and die with the processes holding them.

Two lock files in the run directory:

- `.llmctl.lock`, exclusive: the run's owner. `llmctl train`/`resume` with the local or ssh
  launcher holds it from before the run directory is written until the run has ended, and hands
  it to torchrun (an inherited descriptor: the lock lives while either process does). With no
  llmctl process waiting on the run (SLURM, a bare `python -m llmctl.train.entry`), rank 0
  takes it. It holds a JSON note naming the holder (pid, host, what).
- `.llmctl.ranks.lock`, shared: every training process holds it while it lives. A launcher
  checks that nobody holds it, so ranks left behind by a killed launcher still block a second
  trainer. Rank 0 writes its pid and host into it.

A crashed process releases its locks (the kernel drops them with the descriptor), so there is
no stale lock to clear by hand. The launcher's environment `LLMCTL_RUN_LOCK_HELD=1` tells rank
0 that the owner lock is already held for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

LOCK_FILE = ".llmctl.lock"
RANKS_LOCK_FILE = ".llmctl.ranks.lock"
HELD_ENV = "LLMCTL_RUN_LOCK_HELD"
RANK_WAIT_S = 10.0  # how long a rank waits for a launcher's short check of the ranks lock


@dataclass
class RunLock:
    """An open, locked file; the lock ends with `release` or with every holding process."""

    path: Path
    fd: int

    def release(self) -> None:
        """Unlock and close (idempotent)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _holder_note(what: str) -> bytes:
    note = {"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": time.time()}
    return json.dumps(note).encode() + b"\n"


def _describe_holder(path: Path) -> str:
    try:
        note: dict[str, Any] = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        note = {}
    if not note.get("pid"):
        return "another process"
    what = f"{note['what']} " if note.get("what") else ""
    return f"{what}pid {note['pid']} on host {note.get('host', '?')}"


def _openers(path: Path) -> list[int]:
    """PIDs on this host that have `path` open (the processes that may hold its lock)."""
    target, found = str(path.resolve()), []
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
    return found


def _describe_ranks(path: Path) -> str:
    """The processes holding the ranks lock: the live ones on this host, else the note."""
    pids = _openers(path)
    if not pids:
        return _describe_holder(path)
    return f"pid {', '.join(map(str, pids[:8]))} on host {socket.gethostname()}"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _try_flock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_note(fd: int, what: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder_note(what), 0)


def _refusal(run_dir: Path, holder: str) -> UserError:
    return UserError(
        f"run directory {run_dir} is in use by {holder}; wait for that run to end or stop it "
        "(one trainer per run directory)"
    )


def acquire_run_lock(run_dir: str | Path, what: str = "llmctl train") -> RunLock:
    """Take the owner lock of a run directory for a launcher (creates the directory if needed).

    Raises:
        UserError: Another launcher or job owns the run directory, or training processes of an
            earlier run still live there (the message names the holder's pid and host).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = _open(path)
    if not _try_flock(fd, fcntl.LOCK_EX):
        os.close(fd)
        raise _refusal(run_dir, _describe_holder(path))
    ranks_path = run_dir / RANKS_LOCK_FILE
    ranks_fd = _open(ranks_path)
    try:
        if not _try_flock(ranks_fd, fcntl.LOCK_EX):
            os.close(fd)
            raise _refusal(run_dir, f"training processes ({_describe_ranks(ranks_path)})")
    finally:
        os.close(ranks_fd)
    _write_note(fd, what)
    return RunLock(path=path, fd=fd)


def check_run_lock(run_dir: str | Path) -> None:
    """Refuse a run directory another trainer holds; writes nothing and keeps no lock.

    For `--dry-run`, for checks before a run directory is read, and for SLURM submissions
    (rank 0 of the job takes the lock itself).

    Raises:
        UserError: As `acquire_run_lock`.
    """
    run_dir = Path(run_dir)
    for name, kind in ((LOCK_FILE, None), (RANKS_LOCK_FILE, "training processes")):
        path = run_dir / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no such lock file: nobody ever held it
            continue
        try:
            free = _try_flock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)
        if not free:
            if kind:
                raise _refusal(run_dir, f"{kind} ({_describe_ranks(path)})")
            raise _refusal(run_dir, _describe_holder(path))


def hold_for_rank(run_dir: str | Path, rank: int) -> list[RunLock]:
    """The locks a training process holds for its lifetime (keep the returned list alive).

    Every rank holds the ranks lock (shared); rank 0 also takes the owner lock unless a launcher
    holds it for the run (`LLMCTL_RUN_LOCK_HELD=1`). Rank 0 notes its pid and host.

    Raises:
        UserError: Another trainer owns the run directory (named in the message).
    """
    run_dir = Path(run_dir)
    held: list[RunLock] = []
    if rank == 0 and os.environ.get(HELD_ENV) != "1":
        path = run_dir / LOCK_FILE
        fd = _open(path)
        if not _try_flock(fd, fcntl.LOCK_EX):
            os.close(fd)
            raise _refusal(run_dir, _describe_holder(path))
        _write_note(fd, "llmctl.train.entry rank 0")
        held.append(RunLock(path=path, fd=fd))
    ranks_path = run_dir / RANKS_LOCK_FILE
    fd = _open(ranks_path)
    deadline = time.monotonic() + RANK_WAIT_S
    while not _try_flock(fd, fcntl.LOCK_SH):  # a launcher checks it for a moment only
        if time.monotonic() > deadline:
            os.close(fd)
            raise _refusal(run_dir, _describe_holder(ranks_path))
        time.sleep(0.05)
    if rank == 0:
        _write_note(fd, "trainer rank 0")
    held.append(RunLock(path=ranks_path, fd=fd))
    return held
