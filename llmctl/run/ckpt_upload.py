"""Checkpoints in an object store: the background uploader, and fetching one back. No torch.

With `checkpoint.dir=s3://BUCKET/PREFIX` a save is first the same local save as without it
(megatron-core writes `RUN_DIR/checkpoints/.tmp-iter_N`, every rank marks its files, rank 0
writes the manifest and renames the directory to `iter_N`): that local snapshot is all the
training loop waits for. Then rank 0 hands the committed directory to `Uploader`, a thread that

1. uploads every file of `iter_N` (the manifest with its per-file CRC32s included) through
   `S3Storage.publish_copy`: a pending marker, boto3's transfer manager (parallel multipart
   parts), then the commit marker with a conditional PUT (`If-None-Match: *`), so a
   half-uploaded checkpoint is never listed;
2. replaces the store's `latest` pointer and applies retention in the store (only committed
   checkpoints are listed, so only those can be deleted);
3. prunes the local copies: every older local checkpoint, and this one too unless
   `checkpoint.keep_local`.

Why rank 0 uploads the whole committed directory: the commit protocol already needs every
rank's files in one checkpoints directory (rank 0 reads each rank's marker before it writes the
manifest), i.e. `RUN_DIR` is shared by the ranks (one node, or a shared file system), and the
upload starts only after that commit, so it uploads exactly the files the manifest lists.

An upload that sends nothing for `checkpoint.upload_timeout_s` (a stopped server, a network
cut), or whose requests go unanswered that long, fails; the trainer then applies its
failed-save policy. Progress is recorded in `RUN_DIR/uploads.json` (`llmctl status`): the
backend, the upload in flight, the newest checkpoint committed in the store and the last
error. No credential is ever written: boto3 reads them from the environment.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.run import ckpt_store as store
from llmctl.run.storage import location_text, storage_for
from llmctl.run.storage_posix import PosixStorage, atomic_write

log = logging.getLogger("llmctl.train.checkpoint")

UPLOADS_FILE = "uploads.json"
UPLOAD_ATTEMPTS = 2
"""botocore attempts per request of an upload: a silent server fails a request after about
`UPLOAD_ATTEMPTS * upload_timeout_s`."""


@dataclass(frozen=True, slots=True)
class UploadOutcome:
    """How one upload ended: `error` is None when the checkpoint is committed in the store."""

    step: int
    error: str | None
    seconds: float
    bytes: int


def read_uploads(run_dir: Path) -> dict[str, Any] | None:
    """The uploader's state file of a run directory (None if absent or unreadable)."""
    try:
        data = json.loads((Path(run_dir) / UPLOADS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _storage(location: str, timeout_s: float, part_bytes: int | None = None) -> Any:
    from llmctl.run.storage_s3 import MULTIPART_BYTES, S3Storage

    return S3Storage(
        location,
        multipart_bytes=part_bytes or MULTIPART_BYTES,
        read_timeout_s=timeout_s,
        max_attempts=UPLOAD_ATTEMPTS,
        stall_timeout_s=timeout_s,
    )


def _one_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Uploader:
    """Uploads committed local checkpoints to an object store, one at a time, in a thread.

    Args:
        location: `s3://BUCKET/PREFIX`.
        run_dir: The run directory (local checkpoints in `checkpoints/`, state in
            `uploads.json`).
        timeout_s: `checkpoint.upload_timeout_s`.
        keep_local: Keep the newest uploaded checkpoint in `checkpoints/`.
        keep_last: Retention in the store: newest committed checkpoints kept.
        keep_every: Retention in the store: also keep multiples of this step.
        part_bytes: Multipart part size (default `storage_s3.MULTIPART_BYTES`).
    """

    def __init__(
        self,
        location: str,
        run_dir: Path,
        *,
        timeout_s: float,
        keep_local: bool,
        keep_last: int,
        keep_every: int | None,
        part_bytes: int | None = None,
    ) -> None:
        self.location = location_text(location).rstrip("/")
        self.local_root = Path(run_dir) / "checkpoints"
        self.state_path = Path(run_dir) / UPLOADS_FILE
        self.timeout_s, self.keep_local = timeout_s, keep_local
        self.keep_last, self.keep_every = keep_last, keep_every
        self.part_bytes = part_bytes
        self._thread: threading.Thread | None = None
        self._outcome: UploadOutcome | None = None
        self._lock = threading.Lock()
        old = read_uploads(Path(run_dir)) or {}
        self.state: dict[str, Any] = {
            "backend": self.location,
            "in_flight": None,
            "last_committed": old.get("last_committed") if old.get("backend") == self.location
            else None,
            "last_error": None,
        }  # fmt: skip
        self._write_state()

    # ----- the trainer's side -----

    def in_flight(self) -> bool:
        """Whether an upload is running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, step: int) -> None:
        """Start uploading the committed local checkpoint of `step`."""
        assert not self.in_flight(), "one upload at a time"
        self._thread = threading.Thread(
            target=self._run, args=(step,), name=f"llmctl-upload-{step}", daemon=True
        )
        self._thread.start()

    def join(self) -> None:
        """Wait for the upload in flight (bounded by the storage's stall and request timeouts)."""
        if self._thread is not None:
            self._thread.join()

    def take(self) -> UploadOutcome | None:
        """The outcome of the last finished upload, once."""
        with self._lock:
            outcome, self._outcome = self._outcome, None
        return outcome

    # ----- the thread -----

    def _write_state(self) -> None:
        try:
            atomic_write(self.state_path, (json.dumps(self.state, indent=1) + "\n").encode())
        except OSError as e:  # status only: never fails an upload
            log.warning("cannot write %s (%s)", self.state_path, _one_line(e))

    def _run(self, step: int) -> None:
        t0, name = time.monotonic(), store.iter_name(step)
        local = self.local_root / name
        nbytes = _dir_bytes(local) if local.is_dir() else 0
        self.state["in_flight"] = {"step": step, "bytes": nbytes, "started_unix": time.time()}
        self._write_state()
        error: str | None = None
        try:
            self._upload(local, name, step)
        except Exception as e:  # one line for the failed-save policy
            error = f"upload to {self.location}/{name} failed ({_one_line(e)})"
        seconds = time.monotonic() - t0
        self.state["in_flight"] = None
        if error is None:
            self.state["last_committed"] = {
                "step": step,
                "bytes": nbytes,
                "seconds": round(seconds, 3),
                "unix": time.time(),
            }
            self.state["last_error"] = None
        else:
            self.state["last_error"] = {"step": step, "error": error, "unix": time.time()}
        self._write_state()
        with self._lock:
            self._outcome = UploadOutcome(step=step, error=error, seconds=seconds, bytes=nbytes)

    def _upload(self, local: Path, name: str, step: int) -> None:
        storage = _storage(self.location, self.timeout_s, self.part_bytes)
        root = Path(self.location)
        if storage.exists(name):  # a retried upload that did commit, or a step saved again
            mine = (local / store.MANIFEST).read_bytes()
            if storage.read_bytes(f"{name}/{store.MANIFEST}") != mine:
                store.move_aside(root / name, f"replaced by a new save of step {step}")
        if not storage.exists(name):
            storage.publish_copy(local, name)
        storage.write_bytes(store.LATEST, f"{step}\n".encode())
        steps = store.committed_steps(root)
        for old in store.retention_victims(steps, self.keep_last, self.keep_every):
            if old < step:  # only older committed checkpoints
                storage.delete(store.iter_name(old))
        self._prune_local(step)

    def _prune_local(self, step: int) -> None:
        posix = PosixStorage(self.local_root)
        for old in store.committed_steps(self.local_root):
            if old < step or (old == step and not self.keep_local):
                posix.delete(store.iter_name(old))


@dataclass(frozen=True, slots=True)
class Fetched:
    """The checkpoint chosen from the store, now a committed local directory."""

    step: int
    local: Path
    source: str  # "local copy" (keep_local, identical) or "downloaded"
    seconds: float
    bytes: int


def fetch_newest(
    location: str, local_root: Path, *, timeout_s: float
) -> tuple[Fetched | None, list[str], int]:
    """Make the store's newest valid committed checkpoint a committed local directory.

    Newest first: a store checkpoint whose files are all there with their sizes is taken from
    the local copy if that one has the same manifest and passes full validation, else
    downloaded into `.tmp-iter_N` and renamed; the local directory must pass full validation
    (every CRC32 of the manifest), else it is set aside and the next older one is tried. A
    differing local copy is set aside under `checkpoints/invalid/` (never deleted).

    Returns:
        (the checkpoint or None, one line per store checkpoint skipped, committed steps in
        the store).
    """
    storage = _storage(location, timeout_s)
    root = Path(location_text(location))
    stale = storage.clean_stale()
    if stale:
        log.info("removed leftovers of interrupted uploads: %s", ", ".join(stale))
    steps = store.committed_steps(root)
    skipped: list[str] = []
    posix = PosixStorage(local_root)
    for step in reversed(steps):
        name = store.iter_name(step)
        t0 = time.monotonic()
        remote = store.validate(root / name, full=False)
        if not remote.ok:
            skipped.append(f"{location_text(remote.path)}: {remote.reason}")
            continue
        manifest = storage.read_bytes(f"{name}/{store.MANIFEST}")
        local = local_root / name
        if local.is_dir():
            same = (local / store.MANIFEST).is_file() and (
                local / store.MANIFEST
            ).read_bytes() == manifest
            if same and store.validate(local, full=True).ok:
                return (
                    Fetched(step, local, "local copy", time.monotonic() - t0, remote.size_bytes),
                    skipped,
                    len(steps),
                )
            store.move_aside(local, f"differs from {location_text(remote.path)} in the store")
        tmp = posix.staging_dir(name)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        nbytes = storage.download(name, tmp)
        posix.commit(tmp, name)
        check = store.validate(local, full=True)
        if not check.ok:
            skipped.append(f"{location_text(remote.path)}: downloaded copy {check.reason}")
            store.move_aside(local, f"downloaded copy invalid: {check.reason}")
            continue
        got = Fetched(step, local, "downloaded", time.monotonic() - t0, nbytes)
        return got, skipped, len(steps)
    return None, skipped, len(steps)


def storage_status(run_dir: Path) -> dict[str, Any]:
    """Checkpoint storage of a run directory for `llmctl status`: backend, newest committed
    checkpoint (in the store: as the uploader recorded it), upload in flight, last error.

    Reads local files only (`uploads.json`, `checkpoints/`), so status never waits on a store.
    """
    state = read_uploads(run_dir)
    if state is not None:
        return {
            "backend": state.get("backend"),
            "newest_committed": state.get("last_committed"),
            "in_flight": state.get("in_flight"),
            "last_error": state.get("last_error"),
        }
    steps = store.committed_steps(Path(run_dir) / "checkpoints")
    return {
        "backend": str(Path(run_dir) / "checkpoints"),
        "newest_committed": {"step": steps[-1]} if steps else None,
        "in_flight": None,
        "last_error": None,
    }


def _ago(unix: Any) -> str:
    if not isinstance(unix, int | float):
        return ""
    s = max(0.0, time.time() - unix)
    return f", {s:.0f} s ago" if s < 120 else f", {s / 60:.0f} min ago"


def storage_text(status: dict[str, Any]) -> str:
    """One line of `storage_status` for `llmctl status`."""
    newest = status.get("newest_committed") or {}
    parts = [f"checkpoints {status.get('backend')}"]
    step = newest.get("step")
    parts.append(f"newest committed step {step}{_ago(newest.get('unix'))}" if step else "none")
    flight = status.get("in_flight")
    if flight:
        mib = (flight.get("bytes") or 0) / (1 << 20)
        parts.append(
            f"uploading step {flight.get('step')} ({mib:.1f} MiB{_ago(flight.get('started_unix'))})"
        )
    error = status.get("last_error")
    if error:
        parts.append(f"last upload failed: {error.get('error')}")
    return "; ".join(parts)


def store_resume_step(location: str) -> tuple[int | None, dict[str, Any] | None]:
    """The newest committed checkpoint in the store whose files all have their manifest sizes
    (what a resume will load; the ranks then check every CRC32): its step and its saved
    `train_state.json` (for the launcher's compatibility check), or (None, None).

    Raises:
        UserError: The store refuses the credentials, has no such bucket or does not answer.
    """
    from llmctl.run.storage_s3 import check_reachable

    check_reachable(location)
    root = Path(location_text(location))
    found, _ = store.newest_valid(root, full=False)
    if found is None or found.step is None:
        return None, None
    try:
        saved = json.loads(storage_for(root).read_bytes(f"{found.path.name}/{store.TRAIN_STATE}"))
    except (OSError, ValueError):
        return found.step, None  # the ranks report it
    return found.step, saved if isinstance(saved, dict) else None
