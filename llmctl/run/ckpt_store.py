"""Checkpoint protocol: atomic commit, manifest, validation, retention, listing. No torch.

Why a protocol on top of megatron-core's `dist_checkpointing`: megatron writes a checkpoint
into the directory it is given, file by file, on every rank. A crash in the middle leaves a
directory that looks like a checkpoint but is not one. llmctl therefore assembles each
checkpoint in a staging directory and commits it only when every rank's files are durable::

    RUN_DIR/checkpoints/
      .tmp-iter_0000040/   being written (ignored by readers, removed on the next start)
      iter_0000020/        committed: megatron's files + llmctl's JSON state + manifest.json
      iter_0000030/
      latest               "30\\n", replaced atomically after each commit

Where the storage seam is: the staging directory (the *local snapshot*) is a local directory,
written by megatron-core and the ranks; the functions of the first section below (markers,
manifest) work on it with plain file operations. Everything after that — publishing the
snapshot (`commit`), the `latest` pointer, listing, validation, retention, setting checkpoints
aside — talks only to `llmctl.run.storage.CheckpointStorage`, chosen by `storage_for` from the
checkpoints directory. On POSIX the staging directory is `.tmp-iter_N` inside `checkpoints/`
and publishing it is the in-place rename described below; an object-store backend uploads it.

Commit order (each step durable before the next): every rank writes and fsyncs its shards and
its JSON files, then a `.rank-R.json` marker with their sizes and CRC32s; rank 0 checksums the
files it wrote itself, writes `manifest.json` (temp file + fsync + rename), fsyncs the
directory, publishes it (POSIX: renames `.tmp-iter_N` to `iter_N`, fsyncs `checkpoints/`), and
finally replaces `latest` the same way. A crash at any instant leaves the previous committed
checkpoint intact and either no `iter_N` or a complete one. Deletion (retention) takes the
name away first (POSIX: renames to `.del-iter_N`), so a half-deleted checkpoint never carries
a valid name.

Validation, used on load and by `llmctl checkpoints`: the manifest parses and names its step;
every listed file exists with its size; (full mode) every CRC32 matches and every shard file
that torch's `.metadata` refers to is listed. CRC32 (zlib, about 5 GB/s here) detects
corruption, not tampering; see docs/checkpoints.md for the deserialization rules.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmctl.progress import NO_PROGRESS, Progress
from llmctl.run.ckpt_safe import shard_files_in_metadata
from llmctl.run.storage import CheckpointStorage, is_object_store, location_text, storage_for
from llmctl.run.storage_posix import (  # the local snapshot is a POSIX directory everywhere
    atomic_write,
    fsync_dir,
    fsync_file,
)

FORMAT = "llmctl-checkpoint/1"
MANIFEST = "manifest.json"
LATEST = "latest"
TRAIN_STATE = "train_state.json"
RNG_DIR = "rng"
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


def _crc32(chunks: Iterable[bytes]) -> str:
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _text(data: bytes) -> str:
    """`data` decoded as `Path.read_text` decodes a file (locale encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


# ----- the local snapshot: megatron's directory, the ranks' files, the manifest -----


def write_json_durable(path: Path, obj: Any) -> None:
    """Write JSON to a new file and fsync it (inside a not-yet-committed directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def crc32_file(path: Path) -> str:
    """CRC32 of a file's bytes, as 8 hex digits."""

    def chunks() -> Iterator[bytes]:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK_BYTES):
                yield chunk

    return _crc32(chunks())


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


def _seal(snapshot: Path, manifest: dict[str, Any]) -> None:
    """Make the local snapshot complete and durable: its directories, the manifest, no markers."""
    for sub in {p.parent for p in _files_under(snapshot)}:
        fsync_dir(sub)
    atomic_write(snapshot / MANIFEST, json.dumps(manifest, indent=1).encode())
    for marker in snapshot.glob(".rank-*.json"):
        marker.unlink()


# ----- through the storage interface: commit, latest, listing, retention -----


def _storage(ckpt_dir: Path) -> tuple[CheckpointStorage, str]:
    """The storage holding checkpoint directory `ckpt_dir`, and the checkpoint's name."""
    return storage_for(ckpt_dir.parent), ckpt_dir.name


def staging_dir(ckpt_root: Path, step: int) -> Path:
    """Local directory in which the checkpoint of `step` is written before `commit`."""
    return storage_for(ckpt_root).staging_dir(iter_name(step))


def commit(ckpt_root: Path, tmp_dir: Path, step: int, manifest: dict[str, Any]) -> Path:
    """Write the manifest, publish `tmp_dir` as `iter_N` and point `latest` at it.

    Args:
        ckpt_root: The checkpoints directory.
        tmp_dir: The local snapshot, `staging_dir(ckpt_root, step)`.
        step: The checkpoint's step.
        manifest: From `build_manifest`.

    Returns:
        The committed directory.
    """
    storage, name = storage_for(ckpt_root), iter_name(step)
    _seal(tmp_dir, manifest)
    if storage.exists(name):  # a same-step save the ranks skipped as invalid: keep it as evidence
        move_aside(ckpt_root / name, f"replaced by a new save of step {step}")
    storage.commit(tmp_dir, name)
    storage.write_bytes(LATEST, f"{step}\n".encode())
    return ckpt_root / name


def clean_stale(ckpt_root: Path) -> list[str]:
    """Remove leftovers of interrupted saves and deletions. Returns their names."""
    return storage_for(ckpt_root).clean_stale()


def committed_steps(ckpt_root: Path) -> list[int]:
    """Steps of all committed checkpoint directories, oldest first."""
    names = storage_for(ckpt_root).list()
    steps = (step_of(n[:-1]) for n in names if n.endswith("/"))
    return sorted(s for s in steps if s is not None)


def read_latest(ckpt_root: Path) -> int | None:
    """Step named by the `latest` pointer (None if absent or unreadable)."""
    try:
        return int(_text(storage_for(ckpt_root).read_bytes(LATEST)).strip())
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
    """Delete checkpoints the retention policy no longer keeps. Returns their steps.

    Args:
        ckpt_root: The checkpoints directory.
        keep_last: Newest checkpoints kept.
        keep_every: Also keep the steps divisible by this.
        background: Remove the bytes in a daemon thread (what makes a deletion safe happens
            before return; leftovers are removed by `clean_stale` at the next start).
    """
    storage = storage_for(ckpt_root)
    victims = retention_victims(committed_steps(ckpt_root), keep_last, keep_every)
    for step in victims:
        storage.delete(iter_name(step), background=background)
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


def _read_manifest(
    storage: CheckpointStorage, name: str, result: Validation
) -> dict[str, Any] | None:
    try:
        manifest = json.loads(_text(storage.read_bytes(f"{name}/{MANIFEST}")))
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
    storage: CheckpointStorage,
    name: str,
    files: dict[str, Any],
    crc_part: tuple[int, int] | None,
    result: Validation,
) -> None:
    for i, (rel, entry) in enumerate(sorted(files.items())):
        key = f"{name}/{rel}"
        try:
            size = storage.size(key)
        except OSError:
            result.problems.append(f"missing file {rel}")
            continue
        result.size_bytes += size
        if size != entry["size"]:
            result.problems.append(f"{rel}: size {size} != {entry['size']} in manifest")
        elif (
            crc_part
            and i % crc_part[1] == crc_part[0]
            and _crc32(storage.read_chunks(key, _CHUNK_BYTES)) != entry["crc32"]
        ):
            result.problems.append(f"{rel}: checksum mismatch")


def _check_required(manifest: dict[str, Any], files: dict[str, Any], result: Validation) -> None:
    required = [".metadata", "metadata.json", TRAIN_STATE]
    required += [f"{RNG_DIR}/rank_{r}.json" for r in range(int(manifest.get("world_size", 1)))]
    for rel in required:
        if rel not in files:
            result.problems.append(f"manifest does not list {rel}")


def _check_shards_listed(
    storage: CheckpointStorage, name: str, files: dict[str, Any], result: Validation
) -> None:
    try:
        named = shard_files_in_metadata(storage.read_bytes(f"{name}/.metadata"))
        for rel in sorted(named - set(files)):
            result.problems.append(f"shard {rel} named in .metadata is not in the manifest")
    except Exception as e:  # a hostile or damaged .metadata
        result.problems.append(f".metadata rejected: {e}")


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
    storage, name = _storage(ckpt_dir)
    result = Validation(path=ckpt_dir, step=step_of(name), ok=False)
    manifest = _read_manifest(storage, name, result)
    if manifest is None:
        return result
    result.manifest = manifest
    files = manifest.get("files") or {}
    _check_required(manifest, files, result)
    _check_files(storage, name, files, crc_part if full else None, result)
    if full and not result.problems:
        _check_shards_listed(storage, name, files, result)
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


def _checkpoints_root(location: str | Path) -> Path:
    """`RUN_DIR/checkpoints`, or an object-store location checked to be reachable."""
    if is_object_store(location):
        from llmctl.run.storage_s3 import check_reachable

        check_reachable(str(location))
        return Path(str(location))
    from llmctl.run.rundir import require_run_dir

    return require_run_dir(location) / "checkpoints"  # the one "not a run directory" wording


def describe_checkpoints(
    run_dir: str | Path, *, full: bool = True, progress: Progress = NO_PROGRESS
) -> list[dict[str, Any]]:
    """One JSON-ready row per committed checkpoint of a run directory, newest first.

    Args:
        run_dir: The run directory (holding `checkpoints/`), or a checkpoints location in an
            object store (`s3://BUCKET/PREFIX`).
        full: Verify CRC32s (reads every byte) instead of sizes only.
        progress: One step per checkpoint validated.

    Raises:
        UserError: If `run_dir` is not a run directory, or the object store cannot be used
            (credentials, bucket, endpoint).
    """
    root = _checkpoints_root(run_dir)
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
                "path": location_text(v.path),
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
    storage, name = _storage(ckpt_dir)
    dest = f"{INVALID_DIR}/{name}"
    if storage.exists(dest):
        dest = f"{INVALID_DIR}/{name}-{time.time_ns()}"
    storage.move(name, dest)
    storage.write_bytes(f"{dest}.reason.txt", (reason + "\n").encode())
    return ckpt_dir.parent / dest
