"""How `llmctl data` commands run against their outputs: one run at a time, stoppable.

Where they write (never over a user's files, staged and renamed into place) is
`llmctl.staging`. Rules here (issue 12, finding 1 and 5):

- One run per target: `OutputLock` holds an exclusive `flock` on `<target>.llmctl-lock`; a
  second run is refused in one line naming the holder.
- `interruptible()` turns SIGTERM into an exception like Ctrl-C, so pools are torn down and the
  caller can say what it kept (`Interrupted`, exit code 130 or 143).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any

from llmctl.data.manifest import read_json, write_json_atomic
from llmctl.errors import UserError
from llmctl.staging import make_parent


class Interrupted(UserError):
    """The run was stopped by SIGINT (exit 130) or SIGTERM (exit 143)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives inside `interruptible()`."""


@contextmanager
def interruptible() -> Iterator[None]:
    """Within this block SIGTERM raises `_Terminated` (caught by `stop_code`) like Ctrl-C."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_code(exc: BaseException) -> int | None:
    """130 for Ctrl-C, 143 for SIGTERM, None for any other exception."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, _Terminated):
        return 143
    return None


def worker_signals() -> None:
    """In a pool worker: leave Ctrl-C to the parent, die on SIGTERM (the parent's terminate)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# ---------------------------------------------------------------- lock


def lock_path(target: Path) -> Path:
    """The lock file of an output prefix or folder."""
    return target.with_name(target.name + ".llmctl-lock")


class OutputLock:
    """Exclusive lock on an output target for the duration of a run (`flock`, released by the
    kernel if the process dies; the file is removed on a clean release)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = lock_path(target)
        self._f: IO[str] | None = None

    def __enter__(self) -> OutputLock:
        import fcntl

        make_parent(self.path)
        while True:
            f = open(self.path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                f.seek(0)
                holder = f.read().strip() or "another process"
                f.close()
                raise UserError(
                    f"{self.target} is being written by another llmctl run ({holder}); "
                    f"wait for it or stop it (lock {self.path})"
                ) from None
            if self._same_file(f):
                break
            f.close()  # the holder removed the file between our open and lock: retry
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        self._f = f
        return self

    def _same_file(self, f: IO[str]) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *_exc: object) -> None:
        if self._f is not None:
            self.path.unlink(missing_ok=True)
            self._f.close()
            self._f = None


def command_line() -> dict[str, Any]:
    """How this process was started, for manifests: argv, host, user and cwd."""
    return {
        "argv": list(sys.argv),
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
    }


def check_workers(requested: int) -> None:
    """`-j N` must be >= 0 (0: one process per core).

    Raises:
        UserError: a negative N.
    """
    if requested < 0:
        raise UserError(f"-j/--workers must be >= 0 (0: one per core), got {requested}")


def resolve_workers(requested: int) -> int:
    """Worker processes for `-j N`: 0 means one per core; more than the cores is capped, with
    a one-line note on stderr (more processes than cores only adds memory and switching)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if requested <= 0:
        return cores
    if requested > cores:
        print(
            f"note: -j {requested} is more than the {cores} CPU cores here; using {cores}",
            file=sys.stderr,
        )
        return cores
    return requested


def fresh_work_dir(work_dir: Path, fingerprint: dict[str, Any]) -> Path:
    """The work folder of a resumable run, kept when its plan.json equals `fingerprint`
    (resume) and discarded when an earlier llmctl run made it for other inputs or settings.

    Raises:
        UserError: the folder holds files but no plan.json: it is not llmctl's.
    """
    import shutil

    found = read_json(work_dir / "plan.json")
    if found != fingerprint and work_dir.exists():
        if found is None and any(work_dir.iterdir()):
            raise UserError(
                f"{work_dir} exists and was not written by llmctl; move it away or choose "
                "another --out"
            )
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(work_dir / "plan.json", fingerprint)
    return work_dir
