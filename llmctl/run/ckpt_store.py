"""Checkpoint directories on disk: atomic commit, manifest, validation, retention. No torch.

Why a protocol on top of megatron-core's `dist_checkpointing`: megatron writes a checkpoint
into the directory it is given, file by file, on every rank. A crash in the middle leaves a
directory that looks like a checkpoint but is not one. llmctl therefore writes each checkpoint
under a temporary name and commits it only when every rank's files are durable::

    RUN_DIR/checkpoints/
      .tmp-iter_0000040/   being written (ignored by readers, removed on the next start)
      iter_0000020/        committed: megatron's files + llmctl's JSON state + manifest.json
      iter_0000030/
      latest               "30\\n", replaced atomically after each commit

Commit order (each step durable before the next): every rank writes and fsyncs its shards and
its JSON files, then a `.rank-R.json` marker with their sizes and CRC32s; rank 0 checksums the
files it wrote itself, writes `manifest.json` (temp file + fsync + rename), fsyncs the
directory, renames `.tmp-iter_N` to `iter_N`, fsyncs `checkpoints/`, and finally replaces
`latest` the same way. A crash at any instant leaves the previous committed checkpoint intact
and either no `iter_N` or a complete one. Deletion (retention) renames to `.del-iter_N` first,
so a half-deleted directory never carries a valid name.

Validation, used on load and by `llmctl checkpoints`: the manifest parses and names its step;
every listed file exists with its size; (full mode) every CRC32 matches and every shard file
that torch's `.metadata` refers to is listed. CRC32 (zlib, about 5 GB/s here) detects
corruption, not tampering; see docs/checkpoints.md for the deserialization rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmctl.progress import NO_PROGRESS, Progress

FORMAT = "llmctl-checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
TRAIN_STATE = "train_state.json"
RNG_DIR = "rng"
TMP_PREFIX = ".tmp-"
DEL_PREFIX = ".del-"
RANK_MARKER = ".rank-{rank}.json"
INVALID_DIR = "invalid"  # checkpoints/invalid/: checkpoints set aside, never deleted
_ITER_RE = re.compile(r"^iter_(\d+)$")
_CHUNK_BYTES = 8 << 20


def iter_name(step: int) -> str:
    """Directory name of the checkpoint taken after `step` optimizer steps."""
    return f"iter_{step:07d}"


def step_of(name: str) -> int | None:
    """Step encoded in a committed checkpoint directory name, else None."""
    m = _ITER_RE.match(name)
    return int(m.group(1)) if m else None


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_durable(path: Path, obj: Any) -> None:
    """Write JSON to a new file and fsync it (inside a not-yet-committed directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def crc32_file(path: Path) -> str:
    """CRC32 of a file's bytes, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def file_entry(path: Path) -> dict[str, Any]:
    """Manifest entry of one file: size in bytes and CRC32."""
    return {"size": path.stat().st_size, "crc32": crc32_file(path)}


def _files_under(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            yield Path(dirpath) / name


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def is_rank_marker(rel: str) -> bool:
    """Whether a relative path is a per-rank completion marker."""
    return rel.startswith(".rank-") and rel.endswith(".json")


def write_rank_marker(ckpt_dir: Path, rank: int, files: list[Path]) -> None:
    """fsync `files` (written by this rank), then record their sizes and CRC32s in a marker."""
    entries = {}
    for path in files:
        fsync_file(path)
        entries[_rel(path, ckpt_dir)] = file_entry(path)
    write_json_durable(ckpt_dir / RANK_MARKER.format(rank=rank), {"rank": rank, "files": entries})


def rank_files(ckpt_dir: Path, rank: int) -> list[Path]:
    """Files rank `rank` writes itself: its torch_dist shards and its RNG state."""
    shards = sorted(ckpt_dir.glob(f"__{rank}_*.distcp"))
    rng = ckpt_dir / RNG_DIR / f"rank_{rank}.json"
    return shards + ([rng] if rng.exists() else [])


def build_manifest(ckpt_dir: Path, world_size: int, header: dict[str, Any]) -> dict[str, Any]:
    """Merge every rank's marker with the files rank 0 wrote (checksummed here).

    Raises:
        RuntimeError: If a rank's marker is missing (its write did not complete).
    """
    files: dict[str, Any] = {}
    for rank in range(world_size):
        marker = ckpt_dir / RANK_MARKER.format(rank=rank)
        if not marker.is_file():
            raise RuntimeError(f"rank {rank} did not finish writing {ckpt_dir.name}")
        files.update(json.loads(marker.read_text())["files"])
    for path in _files_under(ckpt_dir):
        rel = _rel(path, ckpt_dir)
        if rel in files or is_rank_marker(rel) or rel == MANIFEST:
            continue
        fsync_file(path)
        files[rel] = file_entry(path)
    return {"format": FORMAT, **header, "checksum": "crc32", "files": dict(sorted(files.items()))}


def commit(ckpt_root: Path, tmp_dir: Path, step: int, manifest: dict[str, Any]) -> Path:
    """Write the manifest, rename `tmp_dir` to `iter_N` and point `latest` at it.

    Returns:
        The committed directory.
    """
    for sub in {p.parent for p in _files_under(tmp_dir)}:
        fsync_dir(sub)
    atomic_write(tmp_dir / MANIFEST, json.dumps(manifest, indent=1).encode())
    for marker in tmp_dir.glob(".rank-*.json"):
        marker.unlink()
    final = ckpt_root / iter_name(step)
    if final.exists():  # a same-step save the ranks skipped as invalid: keep it as evidence
        move_aside(final, f"replaced by a new save of step {step}")
    os.rename(tmp_dir, final)
    fsync_dir(ckpt_root)
    atomic_write(ckpt_root / LATEST, f"{step}\n".encode())
    return final


def remove_checkpoint(path: Path, *, background: bool = False) -> None:
    """Delete a checkpoint directory: rename it out of the valid namespace first.

    Args:
        path: The `iter_N` directory.
        background: Delete the renamed files in a daemon thread (the rename is what makes
            the deletion safe; leftovers are removed by `clean_stale` at the next start).
    """
    import threading

    trash = path.with_name(f"{DEL_PREFIX}{path.name}-{time.time_ns()}")
    os.rename(path, trash)
    fsync_dir(path.parent)
    if background:
        threading.Thread(target=shutil.rmtree, args=(trash, True), daemon=True).start()
    else:
        shutil.rmtree(trash, ignore_errors=True)


def clean_stale(ckpt_root: Path) -> list[str]:
    """Remove leftovers of interrupted saves and deletions. Returns their names."""
    removed: list[str] = []
    if not ckpt_root.is_dir():
        return removed
    for entry in ckpt_root.iterdir():
        if entry.name.startswith((TMP_PREFIX, DEL_PREFIX)) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
        elif entry.name.startswith(f".{LATEST}.") and entry.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                entry.unlink()
    return removed


def committed_steps(ckpt_root: Path) -> list[int]:
    """Steps of all committed checkpoint directories, oldest first."""
    if not ckpt_root.is_dir():
        return []
    steps = (step_of(p.name) for p in ckpt_root.iterdir() if p.is_dir())
    return sorted(s for s in steps if s is not None)


def read_latest(ckpt_root: Path) -> int | None:
    """Step named by the `latest` pointer (None if absent or unreadable)."""
    try:
        return int((ckpt_root / LATEST).read_text().strip())
    except (OSError, ValueError):
        return None


def retention_victims(steps: list[int], keep_last: int, keep_every: int | None) -> list[int]:
    """Steps to delete: all but the newest `keep_last`, except multiples of `keep_every`."""
    keep = set(steps[-max(keep_last, 1) :])
    if keep_every:
        keep |= {s for s in steps if s % keep_every == 0}
    return [s for s in steps if s not in keep]


def apply_retention(
    ckpt_root: Path, keep_last: int, keep_every: int | None, *, background: bool = False
) -> list[int]:
    """Delete checkpoints the retention policy no longer keeps. Returns their steps."""
    victims = retention_victims(committed_steps(ckpt_root), keep_last, keep_every)
    for step in victims:
        remove_checkpoint(ckpt_root / iter_name(step), background=background)
    return victims


@dataclass
class Validation:
    """Outcome of validating one checkpoint directory."""

    path: Path
    step: int | None
    ok: bool
    problems: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    size_bytes: int = 0

    @property
    def reason(self) -> str:
        """The first problem, or "ok"."""
        return self.problems[0] if self.problems else "ok"


def _read_manifest(ckpt_dir: Path, result: Validation) -> dict[str, Any] | None:
    try:
        manifest = json.loads((ckpt_dir / MANIFEST).read_text())
    except FileNotFoundError:
        result.problems.append("manifest.json missing (incomplete save)")
        return None
    except (OSError, ValueError) as e:
        result.problems.append(f"manifest.json unreadable: {e}")
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        result.problems.append("manifest.json has an unknown format")
        return None
    if manifest.get("step") != result.step:
        result.problems.append(f"manifest step {manifest.get('step')} != directory step")
    return manifest


def _check_files(
    ckpt_dir: Path, files: dict[str, Any], crc_part: tuple[int, int] | None, result: Validation
) -> None:
    for i, (rel, entry) in enumerate(sorted(files.items())):
        path = ckpt_dir / rel
        try:
            size = path.stat().st_size
        except OSError:
            result.problems.append(f"missing file {rel}")
            continue
        result.size_bytes += size
        if size != entry["size"]:
            result.problems.append(f"{rel}: size {size} != {entry['size']} in manifest")
        elif crc_part and i % crc_part[1] == crc_part[0] and crc32_file(path) != entry["crc32"]:
            result.problems.append(f"{rel}: checksum mismatch")


def _check_required(manifest: dict[str, Any], files: dict[str, Any], result: Validation) -> None:
    required = [".metadata", "metadata.json", TRAIN_STATE]
    required += [f"{RNG_DIR}/rank_{r}.json" for r in range(int(manifest.get("world_size", 1)))]
    for rel in required:
        if rel not in files:
            result.problems.append(f"manifest does not list {rel}")


def validate(
    ckpt_dir: Path, *, full: bool = True, crc_part: tuple[int, int] = (0, 1)
) -> Validation:
    """Check one committed checkpoint directory.

    Args:
        ckpt_dir: `.../checkpoints/iter_N`.
        full: Also verify CRC32s and that every shard named in torch's `.metadata` is listed
            (reads every byte; see docs/benchmarks.md for the cost). Otherwise sizes only.
        crc_part: (k, n): verify the CRC32 of every n-th file starting at k (in name order), so
            n ranks can share the reading; (0, 1) = all files.
    """
    result = Validation(path=ckpt_dir, step=step_of(ckpt_dir.name), ok=False)
    manifest = _read_manifest(ckpt_dir, result)
    if manifest is None:
        return result
    result.manifest = manifest
    files = manifest.get("files") or {}
    _check_required(manifest, files, result)
    _check_files(ckpt_dir, files, crc_part if full else None, result)
    if full and not result.problems:
        from llmctl.run.ckpt_safe import shard_files_in_metadata

        try:
            for rel in sorted(shard_files_in_metadata(ckpt_dir / ".metadata") - set(files)):
                result.problems.append(f"shard {rel} named in .metadata is not in the manifest")
        except Exception as e:  # a hostile or damaged .metadata
            result.problems.append(f".metadata rejected: {e}")
    result.ok = not result.problems
    return result


def list_checkpoints(ckpt_root: Path, *, full: bool = False) -> list[Validation]:
    """Validate every committed checkpoint, newest first."""
    return [
        validate(ckpt_root / iter_name(s), full=full) for s in reversed(committed_steps(ckpt_root))
    ]


def newest_valid(
    ckpt_root: Path, *, full: bool = True
) -> tuple[Validation | None, list[Validation]]:
    """The newest checkpoint that validates, and the newer ones that were skipped."""
    skipped: list[Validation] = []
    for step in reversed(committed_steps(ckpt_root)):
        v = validate(ckpt_root / iter_name(step), full=full)
        if v.ok:
            return v, skipped
        skipped.append(v)
    return None, skipped


def _layout_text(manifest: dict[str, Any] | None) -> str:
    lay = (manifest or {}).get("layout") or {}
    if not lay:
        return "?"
    dims = [
        f"{d.upper()}={lay[d]}"
        for d in ("tp", "pp", "vpp", "cp", "ep", "dp")
        if d in ("tp", "pp", "dp") or (lay.get(d) or 1) > 1
    ]
    return " ".join(dims)


def describe_checkpoints(
    run_dir: str | Path, *, full: bool = True, progress: Progress = NO_PROGRESS
) -> list[dict[str, Any]]:
    """One JSON-ready row per committed checkpoint of a run directory, newest first.

    Args:
        run_dir: The run directory (holding `checkpoints/`).
        full: Verify CRC32s (reads every byte) instead of sizes only.
        progress: One step per checkpoint validated.

    Raises:
        UserError: If `run_dir` is not a run directory.
    """
    from llmctl.run.rundir import require_run_dir

    run_dir = require_run_dir(run_dir)  # the one "not a run directory" wording
    root = run_dir / "checkpoints"
    latest = read_latest(root)
    steps, checks = list(reversed(committed_steps(root))), []
    with progress.phase("validate checkpoints", len(steps)) as phase:
        for s in steps:
            checks.append(validate(root / iter_name(s), full=full))
            phase.advance()
    rows = []
    for v in checks:
        m = v.manifest or {}
        rows.append(
            {
                "step": v.step,
                "path": str(v.path),
                "size_bytes": v.size_bytes,
                "layout": _layout_text(m),
                "world_size": m.get("world_size"),
                "consumed_samples": m.get("consumed_samples"),
                "created_unix": m.get("created_unix"),
                "valid": v.ok,
                "problems": v.problems,
                "latest": v.step == latest,
            }
        )
    return rows


def move_aside(ckpt_dir: Path, reason: str) -> Path:
    """Move a checkpoint into `checkpoints/invalid/` with a note of why; it is never deleted.

    Retention and loading only see `iter_N` directories directly under `checkpoints/`, so a
    checkpoint moved here is neither loaded nor removed. Returns the new path.
    """
    dest_root = ckpt_dir.parent / INVALID_DIR
    dest_root.mkdir(exist_ok=True)
    dest = dest_root / ckpt_dir.name
    if dest.exists():
        dest = dest_root / f"{ckpt_dir.name}-{time.time_ns()}"
    os.rename(ckpt_dir, dest)
    fsync_dir(ckpt_dir.parent)
    dest.with_name(f"{dest.name}.reason.txt").write_text(reason + "\n")
    return dest
