"""`CheckpointStorage` on a POSIX directory (local disk, NFS, Lustre): fsync, rename. No torch.

Crash safety comes from two POSIX guarantees: `rename` within one file system is atomic, and an
entry is durable once its directory is fsynced. Hence:
- a write goes to a temporary file in the same directory, is fsynced and renamed over the
  target, and the directory is fsynced (`atomic_write`);
- a new checkpoint is assembled in `.tmp-NAME/` inside the root (its staging directory, which
  megatron-core writes in place), and committing it is one rename to `NAME` (refused if `NAME`
  exists) followed by an fsync of the root;
- a deletion first renames `NAME` to `.del-NAME-<ns>`, so a half-deleted directory never
  carries a valid name; `.tmp-` and `.del-` leftovers are removed by `clean_stale`.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

TMP_PREFIX = ".tmp-"
DEL_PREFIX = ".del-"
_TEMP_RE = re.compile(r"^\..+\.\d+\.tmp$")  # a temp file of `atomic_write`: `.NAME.PID.tmp`


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or new entry in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync one file's data and metadata."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `path` so readers see the old content or the new one, never a mix.

    Temp file in the same directory, fsync, rename over `path`, fsync the directory.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # matches _TEMP_RE
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class PosixStorage:
    """Checkpoints under one directory; keys are paths relative to it.

    Args:
        root: The checkpoints directory (`RUN_DIR/checkpoints`); need not exist yet.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def list(self, prefix: str = "") -> list[str]:
        """Entries of the directory `prefix`; subdirectories with a trailing `/`."""
        where = self._path(prefix)
        if not where.is_dir():
            return []
        with os.scandir(where) as entries:
            return sorted(e.name + "/" if e.is_dir() else e.name for e in entries)

    def exists(self, key: str) -> bool:
        """Whether the file or directory `key` exists."""
        return self._path(key).exists()

    def size(self, key: str) -> int:
        """`st_size` of the file `key`."""
        return self._path(key).stat().st_size

    def read_bytes(self, key: str) -> bytes:
        """The file's bytes."""
        return self._path(key).read_bytes()

    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        """The file's bytes, `chunk_bytes` at a time."""
        with open(self._path(key), "rb") as f:
            while chunk := f.read(chunk_bytes):
                yield chunk

    def write_bytes(self, key: str, data: bytes) -> None:
        """`atomic_write` (parent directories created)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)

    def staging_dir(self, name: str) -> Path:
        """`ROOT/.tmp-NAME`: committing it is a rename within the root."""
        return self.root / f"{TMP_PREFIX}{name}"

    def commit(self, staging: Path, name: str) -> None:
        """Rename `staging` to `ROOT/NAME` (refused if that exists), then fsync the root.

        The files in `staging` must already be durable (the commit protocol fsyncs them).
        Between the check and the rename no other writer can take `NAME`: the run-directory
        lock admits one trainer, and rename(2) itself refuses a non-empty target.
        """
        final = self._path(name)
        if final.exists():
            raise FileExistsError(errno.EEXIST, "checkpoint already committed", str(final))
        os.rename(staging, final)
        fsync_dir(self.root)

    def move(self, src: str, dst: str) -> None:
        """Rename `src` to `dst` (parent directories created), fsyncing both parents."""
        old, new = self._path(src), self._path(dst)
        if new.exists():
            raise FileExistsError(errno.EEXIST, "already exists", str(new))
        new.parent.mkdir(parents=True, exist_ok=True)
        os.rename(old, new)
        fsync_dir(old.parent)
        if new.parent != old.parent:
            fsync_dir(new.parent)

    def delete(self, key: str, *, background: bool = False) -> None:
        """A directory is renamed to `.del-NAME-<ns>` (fsynced), then removed; a file unlinked."""
        path = self._path(key)
        if not path.is_dir():
            path.unlink()
            fsync_dir(path.parent)
            return
        trash = path.with_name(f"{DEL_PREFIX}{path.name}-{time.time_ns()}")
        os.rename(path, trash)
        fsync_dir(path.parent)
        if background:
            threading.Thread(target=shutil.rmtree, args=(trash, True), daemon=True).start()
        else:
            shutil.rmtree(trash, ignore_errors=True)

    def clean_stale(self) -> builtins.list[str]:
        """Remove `.tmp-`/`.del-` directories and `atomic_write` temp files; returns the dirs."""
        removed: builtins.list[str] = []
        if not self.root.is_dir():
            return removed
        for entry in self.root.iterdir():
            if entry.name.startswith((TMP_PREFIX, DEL_PREFIX)) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
            elif _TEMP_RE.match(entry.name) and not entry.is_dir():
                with contextlib.suppress(OSError):
                    entry.unlink()
        return removed
