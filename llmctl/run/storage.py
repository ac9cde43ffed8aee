"""Where committed checkpoints live: one small interface, and the choice of its backend. No torch.

The seam: megatron-core's `dist_checkpointing.save` writes a checkpoint's tensors into a local
directory, and `dist_checkpointing.load` reads them from one; that stays a local-directory
operation. Around it, llmctl's commit protocol (`ckpt_store`) assembles each new checkpoint in a
local *staging* directory (`staging_dir`), then *publishes* it through this interface
(`commit`); validation, retention, listing and the `latest` pointer use only the interface.
On POSIX (`PosixStorage`) the staging directory is `.tmp-iter_N` inside the checkpoints
directory and publishing is the existing in-place commit (a rename). The object store backend
(`storage_s3.S3Storage`, s3://) implements the same methods: its staging directory is local
scratch, and its `commit` uploads that directory and then creates one marker object with a
conditional PUT (`If-None-Match: *`), listing a checkpoint only once its marker exists.

Keys are `/`-separated paths relative to the storage root (the checkpoints directory), e.g.
`latest` or `iter_0000040/manifest.json`; a checkpoint's name (`iter_0000040`) is the prefix of
its files. `storage_for` picks the backend for a location: a POSIX directory, or
`s3://BUCKET/PREFIX` (`storage_s3.S3Storage`, boto3 imported only then).
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from llmctl.errors import UserError
from llmctl.run.storage_posix import PosixStorage

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_S3_RE = re.compile(r"^s3:/")  # also `s3:/B/P`: what `pathlib.Path("s3://B/P")` keeps of it


class CheckpointStorage(Protocol):
    """A checkpoints root: objects under `/`-separated keys, and atomically published names.

    Every method raises `OSError` (`FileNotFoundError` where a key is absent) on a storage
    failure. Writes are durable when they return.
    """

    def list(self, prefix: str = "") -> list[str]:
        """Names directly under `prefix` (`""` or ending in `/`), sorted.

        An object is listed by its name (`latest`), a prefix holding objects with a trailing
        `/` (`iter_0000040/`), like an S3 listing with delimiter `/`. Empty when nothing is
        stored under `prefix` (also when the root does not exist).
        """
        ...

    def exists(self, key: str) -> bool:
        """Whether `key` is an object, or a prefix with objects under it."""
        ...

    def size(self, key: str) -> int:
        """Size in bytes of the object `key`."""
        ...

    def read_bytes(self, key: str) -> bytes:
        """The whole content of the object `key`."""
        ...

    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        """The content of the object `key` in pieces of at most `chunk_bytes` (large shards)."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None:
        """Create or replace the object `key`: readers see the old content or all of `data`,
        never part of it."""
        ...

    def staging_dir(self, name: str) -> Path:
        """Local directory in which a new checkpoint `name` is assembled before `commit`."""
        ...

    def commit(self, staging: Path, name: str) -> None:
        """Publish the complete staging directory as `name`, atomically and only if absent.

        Before it returns `name` is not listed; after, every file `staging/REL` reads as
        `name/REL` (the staging directory is consumed). This is the create-if-absent step
        (an object store's conditional PUT `If-None-Match: *`).

        Raises:
            FileExistsError: If `name` already exists (nothing is published).
        """
        ...

    def move(self, src: str, dst: str) -> None:
        """Move everything under `src` to `dst` (set a checkpoint aside).

        Raises:
            FileExistsError: If `dst` already exists.
        """
        ...

    def delete(self, key: str, *, background: bool = False) -> None:
        """Remove the object `key`, or everything under the prefix `key` (one checkpoint).

        Once it returns, `key` is no longer listed, even if removing the bytes is interrupted
        (leftovers go at the next `clean_stale`).

        Args:
            key: An object or a checkpoint name.
            background: The bytes may be removed after return (a daemon thread).

        Raises:
            FileNotFoundError: If nothing is stored under `key`.
        """
        ...

    def clean_stale(self) -> builtins.list[str]:
        """Remove leftovers of interrupted writes, commits and deletions. Returns their names."""
        ...


def is_object_store(location: str | Path) -> bool:
    """Whether a checkpoints location names an object store (`s3://...`), not a directory."""
    return bool(_S3_RE.match(str(location)))


def location_text(location: str | Path) -> str:
    """A location as a user writes it: `s3://B/P` again where `pathlib` made it `s3:/B/P`."""
    return re.sub(r"^s3:/(?!/)", "s3://", str(location))


def storage_for(location: str | Path) -> CheckpointStorage:
    """The storage backend of a checkpoints location: a POSIX directory or `s3://BUCKET/PREFIX`.

    Raises:
        UserError: If `location` is a URL of another scheme, or has no bucket.
    """
    text = str(location)
    if is_object_store(text):
        from llmctl.run.storage_s3 import S3Storage

        return S3Storage(text)
    scheme = _SCHEME_RE.match(text)
    if scheme:
        raise UserError(
            f"checkpoint storage {text}: {scheme.group(1)}:// is not supported; use a directory "
            "or s3://BUCKET/PREFIX"
        )
    return PosixStorage(Path(location))
