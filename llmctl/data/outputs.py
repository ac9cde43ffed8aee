"""Where `llmctl data` commands write: never over a user's files, one run at a time.

Rules every command follows (issue 12, finding 1 and 5):

- A target that exists and is not empty is refused unless `force` is set. With `force`, only
  llmctl's own outputs are replaced: for a folder, the files its `.llmctl-outputs.json` lists
  (written by the previous llmctl run); a file in the way that llmctl did not write is refused
  even with `force`, and every other file in the folder is left alone.
- Output folders are built in a staging folder beside the target (same file system) and
  renamed into place; into an existing folder (with `force`) the staged files are renamed one
  by one and the marker is written last.
- One run per target: `OutputLock` holds an exclusive `flock` on `<target>.llmctl-lock`; a
  second run is refused in one line naming the holder.
- Output locations that cannot be written (a parent that is a file, a read-only folder) are one
  `UserError`, found before any work is done.
- `interruptible()` turns SIGTERM into an exception like Ctrl-C, so pools are torn down and the
  caller can say what it kept (`Interrupted`, exit code 130 or 143).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any

from llmctl.errors import UserError
from llmctl.staging import check_writable_parent, exists_error, not_ours_error

MARKER = ".llmctl-outputs.json"


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


# ---------------------------------------------------------------- locations


def make_parent(path: Path) -> None:
    """Create the folders above `path`, as one `UserError` if that fails."""
    check_writable_parent(path)
    try:
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the folder of {path}: {e.strerror or e}") from None


def check_file_targets(paths: list[Path], force: bool, what: str) -> None:
    """Refuse existing output files unless `force`; refuse folders in their place always.

    Raises:
        UserError: a target exists (without force), is a folder, or cannot be written.
    """
    for p in paths:
        check_writable_parent(p)
        if p.is_dir():
            raise UserError(f"{p} is a folder; {what} writes a file there")
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        raise exists_error(existing[0])


def _own_files(folder: Path) -> set[str]:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return set()
    files = data.get("files") if isinstance(data, dict) else None
    return {str(f) for f in files} if isinstance(files, list) else set()


def folder_contents(folder: Path) -> list[str]:
    """Relative paths of the files under `folder`, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def check_dir_target(target: Path, force: bool, what: str) -> None:
    """A folder target must be absent, empty, or (with force) a folder llmctl wrote into.

    Raises:
        UserError: it is a file, not empty without force, or cannot be written.
    """
    check_writable_parent(target)
    if target.exists() and not target.is_dir():
        raise UserError(f"{target} is a file; {what} writes a folder there")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise exists_error(target)


def new_stage(target: Path) -> Path:
    """An empty staging folder beside `target` (same file system, hidden name)."""
    make_parent(target)
    parent = target.absolute().parent
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.llmctl-stage-", dir=parent))


def commit_dir(
    stage: Path, target: Path, command: str, metadata: tuple[str, ...] = ()
) -> list[str]:
    """Move a staged folder's files into `target`; return their relative paths.

    An absent or empty target is replaced by the staged folder in one rename. Into a folder
    that holds other files (allowed by the caller's `force`), files a previous llmctl run wrote
    there are replaced or removed, the rest are kept, and a staged file whose name is taken by
    a file llmctl did not write is refused before anything moves. The marker is written last.

    Raises:
        UserError: a staged file would replace a file llmctl did not write.
    """
    files = folder_contents(stage)
    marker = {"command": command, "files": files, "metadata": list(metadata)}
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        _write_marker(stage / MARKER, marker)
        os.replace(stage, target)
        return files
    check_collisions(target, files)
    own = _own_files(target)
    (target / MARKER).unlink(missing_ok=True)
    for rel in sorted(own - set(files)):
        (target / rel).unlink(missing_ok=True)
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / rel, target / rel)
    _write_marker(target / MARKER, marker)
    shutil.rmtree(stage, ignore_errors=True)
    return files


def check_collisions(target: Path, files: list[str]) -> None:
    """Before any work: refuse if an output file would replace a file llmctl did not write.

    Raises:
        UserError: naming the first such file.
    """
    if not target.is_dir():
        return
    own = _own_files(target)
    for rel in files:
        dest = target / rel
        if (dest.exists() or dest.is_symlink()) and rel not in own:
            raise not_ours_error(dest)


def _write_marker(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def metadata_files(folder: Path) -> set[str]:
    """Files of an llmctl output folder that are reports, not data (e.g. dedup_report.json)."""
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return set()
    meta = data.get("metadata") if isinstance(data, dict) else None
    return {str(m) for m in meta} if isinstance(meta, list) else set()


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
