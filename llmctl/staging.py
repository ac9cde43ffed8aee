"""Outputs written beside their final name, then moved into place in one rename.

A reader never sees a half-written output under its final name: commands write into a hidden
sibling folder and publish it only when complete (replacing an earlier output only then, after
the caller has checked it is llmctl's own and `--force` was given).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from llmctl.errors import UserError


def check_writable_parent(path: Path) -> None:
    """The nearest existing ancestor of `path` must be a folder this process can write.

    Raises:
        UserError: an ancestor is a file, or the folder is not writable.
    """
    parent = path.absolute().parent
    while not parent.exists():
        if parent.is_symlink():
            raise UserError(f"cannot write {path}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"cannot write {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK) or _read_only_fs(parent):
        raise UserError(f"cannot write {path}: folder {parent} is not writable")


def _read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def exists_error(path: Path) -> UserError:
    """The one wording, in every command, for an output that is already there."""
    return UserError(
        f"{path} exists; pass --force to replace llmctl's own outputs, or choose another --out"
    )


def not_ours_error(path: Path) -> UserError:
    """The one wording, in every command, for a file in the way that llmctl did not write."""
    return UserError(
        f"{path} exists and was not written by llmctl; not replacing it (move it away or "
        "choose another --out)"
    )


def check_out(out: Path, force: bool, marker: str) -> None:
    """`out` must be absent, an empty folder, or (with `force`) a folder llmctl wrote, which
    holds `marker`.

    Raises:
        UserError: `exists_error` without `force`; `not_ours_error` with it; a place that
            cannot be written (a parent that is a file, a read-only folder).
    """
    check_writable_parent(out)
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not force:
        raise exists_error(out)
    if not out.is_dir() or not (out / marker).is_file():
        raise not_ours_error(out)


def check_file_out(out: Path, force: bool, header: str, what: str) -> None:
    """A single-file output `out` (`what` names the command and file kind, for the message)
    may be written only where nothing is, or (with `force`) over a file llmctl wrote, whose
    text starts with `header`.

    Raises:
        UserError: `out` is a folder or cannot be written; `exists_error` without `force`;
            `not_ours_error` with it.
    """
    check_writable_parent(out)
    if out.is_dir():
        raise UserError(f"{out} is a folder; {what}")
    if not out.exists():
        return
    if not force:
        raise exists_error(out)
    try:
        ours = out.read_text(errors="replace").startswith(header)
    except OSError as exc:
        raise UserError(f"cannot read {out}: {exc.strerror}") from None
    if not ours:
        raise not_ours_error(out)


def staging_dir(out: Path) -> Path:
    """A new hidden sibling of `out` to write into (mode 0755 under the usual umask)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    return path


def publish(staging: Path, out: Path) -> None:
    """Move the finished `staging` folder to `out`, replacing what is there only now."""
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    staging.rename(out)
