"""Outputs written beside their final name, then moved into place in one rename.

A reader never sees a half-written output under its final name: commands write into a hidden
sibling folder and publish it only when complete (replacing an earlier output only then, after
the caller has checked it is llmctl's own and `--force` was given).

Two publishing forms share the location checks and the wording of their errors:

- A whole folder (`import hf`, `export hf`, `quantize`): `check_out`, `staging_dir`, then
  `publish` replaces the target in one rename.
- Files into a folder that may hold others (the `llmctl data` commands, issue 12): a target
  that exists and is not empty is refused unless `force` is set. With `force`, only llmctl's
  own outputs are replaced: the files the folder's `.llmctl-outputs.json` lists (written by the
  previous llmctl run); a file in the way that llmctl did not write is refused even with
  `force`, and every other file in the folder is left alone. `new_stage` builds the output
  beside the target; `commit_dir` renames it into place, or its files one by one into an
  existing folder, writing the marker last.

Output locations that cannot be written (a parent that is a file, a read-only folder) are one
`UserError`, found before any work is done.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

MARKER = ".llmctl-outputs.json"
"""The file in an output folder that lists the files llmctl wrote there (`commit_dir`)."""


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


def write_text_whole(out: Path, text: str) -> None:
    """Write a single-file output whole or not at all: into a hidden temporary sibling,
    renamed into place (its folder is created).

    Raises:
        UserError: the file or its folder cannot be written.
    """
    tmp = out.with_name(f".{out.name}.llmctl-partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {out}: {exc.strerror}") from None


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


# ---------------------------------------------------------------- files into a folder


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
