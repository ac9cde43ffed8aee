"""`CheckpointStorage` on an S3 bucket (AWS S3 or any S3-compatible store) through boto3. No torch.

Location `s3://BUCKET/PREFIX`; the endpoint, region and credentials come from boto3's standard
chain (`AWS_ENDPOINT_URL`, `AWS_REGION`/`AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, ...). llmctl never writes any of
them to a file; the client is cached in memory per set of those values.

An object store has no rename, so publication is a marker. Under `PREFIX/.llmctl/` it keeps
two kinds of small objects per published name `NAME` (a checkpoint, or one set aside under
`invalid/`):

- `.llmctl/pending/NAME`, written before the first byte of `NAME/` is uploaded;
- `.llmctl/commits/NAME`, created after the last byte with a conditional PUT
  (`If-None-Match: *`): of two commits of one name, exactly one succeeds.

A name that has a pending marker and no commit marker is *hidden*: `list` and `exists` do not
show it, so a checkpoint whose upload was cut off (process killed, server stopped) is never
listed, selected or validated, and `clean_stale` removes its objects. Deletion removes the
commit marker first (the name is hidden from then on), then the objects, then the pending
marker. Objects written with `write_bytes` (`latest`, reason notes) carry no markers: a single
PUT is atomic on S3.

Writers: one trainer per checkpoints location (the run-directory lock), as on POSIX. The check
that `NAME` is not committed happens before the upload, so a second commit of a committed name
uploads nothing; the conditional PUT settles the race between two writers that pass it together.

Reads (`read_bytes`, `size`, `read_chunks`) do not look at markers: callers reach a key through
a listed name. Every storage failure is raised as `OSError` (`FileNotFoundError` for a missing
key) with the S3 error code; `check_reachable` turns wrong credentials, a missing bucket or an
unreachable endpoint into one-line `UserError`s before anything is written.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

META = ".llmctl"
PENDING = f"{META}/pending/"
COMMITS = f"{META}/commits/"
MULTIPART_BYTES = 64 << 20
"""Files at least this large are uploaded in parts of this size (S3 minimum part: 5 MiB)."""
MAX_CONCURRENCY = 8
"""Parts and files in flight at once during a commit."""
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
"""Default seconds a request may wait on a silent server (socket reads and writes)."""
MAX_ATTEMPTS = 3
"""botocore attempts per request (standard mode): a stalled server fails a request after about
`MAX_ATTEMPTS * (READ_TIMEOUT_S + backoff)` seconds instead of hanging."""

STALL_TIMEOUT_S = 120
"""Default seconds without any uploaded byte after which a commit gives up."""

_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)
_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Location:
    """A parsed `s3://BUCKET/PREFIX` (prefix without leading or trailing `/`)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """The location as `s3://BUCKET/PREFIX`."""
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def parse_location(text: str) -> S3Location:
    """`s3://BUCKET/PREFIX` (also `s3:/BUCKET/PREFIX`, what `pathlib` makes of it).

    Raises:
        UserError: If there is no bucket name.
    """
    rest = text.split(":", 1)[1].lstrip("/")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise UserError(f"checkpoint storage {text}: no bucket; expected s3://BUCKET/PREFIX")
    return S3Location(bucket=bucket, prefix=prefix.strip("/"))


def _boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise UserError("s3:// checkpoint storage needs boto3: pip install 'llmctl[s3]'") from None
    return boto3


def client(*, read_timeout_s: float = READ_TIMEOUT_S, max_attempts: int = MAX_ATTEMPTS) -> Any:
    """A boto3 S3 client from the standard AWS environment, cached per environment.

    Args:
        read_timeout_s: Seconds a request waits on a silent server before it fails (retried).
        max_attempts: Attempts per request.
    """
    env = "\0".join(
        [*(os.environ.get(k, "") for k in _ENV), str(read_timeout_s), str(max_attempts)]
    )
    key = hashlib.sha256(env.encode()).hexdigest()  # the cache keys on no secret in clear
    with _clients_lock:
        if key not in _clients:
            boto3 = _boto3()
            from botocore.config import Config

            config = Config(
                connect_timeout=min(CONNECT_TIMEOUT_S, read_timeout_s),
                read_timeout=read_timeout_s,
                retries={"max_attempts": max_attempts, "mode": "standard"},
                max_pool_connections=4 * MAX_CONCURRENCY,
            )
            _clients[key] = boto3.session.Session().client("s3", config=config)
        return _clients[key]


def _code(e: BaseException) -> str:
    response = getattr(e, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) or type(e).__name__


def _os_error(e: BaseException, what: str) -> OSError:
    code = _code(e)
    if code in ("404", "NoSuchKey", "NotFound"):
        return FileNotFoundError(errno.ENOENT, "no such object", what)
    return OSError(errno.EIO, f"S3 {code}: {e}", what)


@contextlib.contextmanager
def _s3_errors(what: str) -> Iterator[None]:
    """botocore's exceptions as `OSError`s naming `what`."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise _os_error(e, what) from e


def _default_scratch(where: S3Location) -> Path:
    tag = hashlib.sha256(where.url.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"llmctl-staging-{os.getuid()}" / tag


def _local_files(staging: Path) -> builtins.list[tuple[Path, str]]:
    return sorted((p, p.relative_to(staging).as_posix()) for p in staging.rglob("*") if p.is_file())


def _progress_watch() -> Any:
    """An s3transfer subscriber that records when the last byte went out (`.last`)."""
    from s3transfer.subscribers import BaseSubscriber

    class Watch(BaseSubscriber):  # type: ignore[misc]
        last = time.monotonic()

        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            self.last = time.monotonic()

    return Watch()


def _wait_all(futures: builtins.list[Any], watch: Any, stall_timeout_s: float, what: str) -> None:
    """Wait for every transfer; raise the first failure, or `TimeoutError` on a stall."""
    pending = list(futures)
    while pending:
        for future in [f for f in pending if f.done()]:
            future.result()  # raises the transfer's error
            pending.remove(future)
        idle_s = time.monotonic() - watch.last
        if pending and idle_s > stall_timeout_s:
            raise TimeoutError(
                errno.ETIMEDOUT, f"upload stalled: no progress for {stall_timeout_s:g} s", what
            )
        time.sleep(0.02)


class S3Storage:
    """Checkpoints under `s3://BUCKET/PREFIX`; keys are relative to the prefix.

    Args:
        location: `s3://BUCKET/PREFIX`.
        scratch: Local directory holding staging directories (default: under the temp dir).
        multipart_bytes: Part size, and the size from which a file is uploaded in parts.
        read_timeout_s: Seconds one request may wait on a silent (stalled) server.
        max_attempts: Attempts per request.
        stall_timeout_s: A commit whose upload sends no byte for this long fails with
            `TimeoutError` (an `OSError`), its name hidden (no commit marker).
    """

    def __init__(
        self,
        location: str,
        *,
        scratch: Path | None = None,
        multipart_bytes: int = MULTIPART_BYTES,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_attempts: int = MAX_ATTEMPTS,
        stall_timeout_s: float = STALL_TIMEOUT_S,
    ) -> None:
        self.location = parse_location(location)
        self.bucket = self.location.bucket
        self.scratch = scratch or _default_scratch(self.location)
        self.multipart_bytes = multipart_bytes
        self.stall_timeout_s = stall_timeout_s
        self.client = client(read_timeout_s=read_timeout_s, max_attempts=max_attempts)

    # ----- keys and listing -----

    def _key(self, key: str) -> str:
        return f"{self.location.prefix}/{key}" if self.location.prefix else key

    def _strip(self, full: str) -> str:
        n = len(self.location.prefix) + 1 if self.location.prefix else 0
        return full[n:]

    def _pages(self, prefix: str, delimiter: str = "") -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        with _s3_errors(self._url(prefix)):
            yield from self.client.get_paginator("list_objects_v2").paginate(**kwargs)

    def _keys_under(self, prefix: str) -> builtins.list[str]:
        """Every key (relative) that starts with `prefix`."""
        return [self._strip(o["Key"]) for p in self._pages(prefix) for o in p.get("Contents", [])]

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def _markers(self) -> tuple[set[str], set[str]]:
        """(names with a pending marker, names with a commit marker): one listing."""
        pending: set[str] = set()
        committed: set[str] = set()
        for key in self._keys_under(f"{META}/"):
            if key.startswith(PENDING):
                pending.add(key[len(PENDING) :])
            elif key.startswith(COMMITS):
                committed.add(key[len(COMMITS) :])
        return pending, committed

    def hidden(self) -> set[str]:
        """Names with a pending marker and no commit marker: uploads or deletions cut off."""
        pending, committed = self._markers()
        return pending - committed

    def list(self, prefix: str = "") -> builtins.list[str]:
        """A delimiter listing of `prefix` without `.llmctl/`, hidden names and empty prefixes.

        Some servers (SeaweedFS) keep listing a prefix as a directory after its last object is
        deleted; a prefix that is not a committed name is listed only if it holds an object.
        """
        objects: set[str] = set()
        prefixes: set[str] = set()
        for page in self._pages(prefix, "/"):
            objects.update(self._strip(o["Key"])[len(prefix) :] for o in page.get("Contents", []))
            prefixes.update(
                self._strip(p["Prefix"])[len(prefix) : -1] for p in page.get("CommonPrefixes", [])
            )
        pending, committed = self._markers()
        if not prefix:
            prefixes.discard(META)
        shown = {
            n + "/"
            for n in prefixes
            if prefix + n in committed
            or (prefix + n not in pending and self._has_objects(f"{prefix}{n}/"))
        }
        return sorted((objects - {""}) | shown)

    def _has_objects(self, prefix: str) -> bool:
        with _s3_errors(self._url(prefix)):
            page = self.client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._key(prefix), MaxKeys=1
            )
        return bool(page.get("KeyCount") or page.get("Contents"))

    def _is_object(self, key: str) -> bool:
        try:
            with _s3_errors(self._url(key)):
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except FileNotFoundError:
            return False
        return True

    def _is_hidden(self, key: str, hidden: set[str]) -> bool:
        parts = key.split("/")
        return any("/".join(parts[: i + 1]) in hidden for i in range(len(parts)))

    def exists(self, key: str) -> bool:
        """An object `key`, or objects under `key/`, not inside a hidden name."""
        if self._is_hidden(key, self.hidden()):
            return False
        return self._is_object(key) or self._has_objects(f"{key}/")

    # ----- objects -----

    def size(self, key: str) -> int:
        """`ContentLength` of a HEAD."""
        with _s3_errors(self._url(key)):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        return int(head["ContentLength"])

    def read_bytes(self, key: str) -> bytes:
        """One GET."""
        with _s3_errors(self._url(key)):
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            return bytes(body.read())

    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        """One streamed GET, read `chunk_bytes` at a time."""
        with _s3_errors(self._url(key)):
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            try:
                while chunk := body.read(chunk_bytes):
                    yield bytes(chunk)
            finally:
                body.close()

    def write_bytes(self, key: str, data: bytes) -> None:
        """One PUT (atomic on S3)."""
        with _s3_errors(self._url(key)):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))

    def _put_marker(self, key: str, *, if_absent: bool = False) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key), "Body": b""}
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        try:
            with _s3_errors(self._url(key)):
                self.client.put_object(**kwargs)
        except OSError as e:
            if "PreconditionFailed" in str(e):
                raise FileExistsError(errno.EEXIST, "already committed", self._url(key)) from e
            raise

    def _delete_keys(self, keys: Iterable[str]) -> None:
        batch = [{"Key": self._key(k)} for k in keys]
        for i in range(0, len(batch), 1000):  # the DeleteObjects limit
            with _s3_errors(self._url("")):
                out = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch[i : i + 1000], "Quiet": True}
                )
            if out.get("Errors"):
                err = out["Errors"][0]
                raise OSError(errno.EIO, f"S3 {err.get('Code')}: delete failed", err.get("Key"))

    # ----- publishing -----

    def staging_dir(self, name: str) -> Path:
        """`SCRATCH/NAME` on local disk."""
        return self.scratch / name

    def _upload(self, files: builtins.list[tuple[Path, str]], name: str) -> None:
        """Upload `(path, rel)` pairs to `name/rel`, in parallel; large files in parts.

        Raises:
            TimeoutError: If no byte went out for `stall_timeout_s` (the transfer is abandoned;
                its threads end with their requests' timeouts).
            OSError: If a request failed.
        """
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(
            multipart_threshold=self.multipart_bytes,
            multipart_chunksize=self.multipart_bytes,
            max_concurrency=MAX_CONCURRENCY,
        )
        tm = create_transfer_manager(self.client, config)
        watch = _progress_watch()
        futures: builtins.list[Any] = []
        ok = False
        try:
            with _s3_errors(self._url(name)):
                for p, rel in files:
                    key = self._key(f"{name}/{rel}")
                    futures.append(tm.upload(str(p), self.bucket, key, subscribers=[watch]))
                _wait_all(futures, watch, self.stall_timeout_s, self._url(name))
            ok = True
        finally:
            if ok:
                tm.shutdown()
            else:  # do not wait for requests stuck on a stalled server
                for future in futures:
                    future.cancel()
                threading.Thread(target=tm.shutdown, kwargs={"cancel": True}, daemon=True).start()

    def commit(self, staging: Path, name: str) -> None:
        """Pending marker, parallel upload of `staging`, conditional PUT of the commit marker.

        A hidden leftover of `name` (an earlier upload cut off) is removed first.
        """
        self.publish_copy(staging, name)
        shutil.rmtree(staging)

    def publish_copy(self, local: Path, name: str) -> None:
        """`commit` of a local directory that stays where it is (a committed local checkpoint
        that the trainer uploads in the background, `ckpt_upload`)."""
        if self.exists(name):
            raise FileExistsError(errno.EEXIST, "checkpoint already committed", self._url(name))
        leftovers = self._keys_under(f"{name}/")
        if leftovers:
            self._delete_keys(leftovers)
        self._put_marker(PENDING + name)
        self._upload(_local_files(local), name)
        self._put_marker(COMMITS + name, if_absent=True)

    def download(self, name: str, dest: Path) -> int:
        """Every object under `name/` into the directory `dest` (parallel, large ones in ranged
        parts), with the same stall bound as uploads. Returns the bytes downloaded.

        Raises:
            TimeoutError: If no byte came in for `stall_timeout_s`.
            OSError: If a request failed.
        """
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        keys = self._keys_under(f"{name}/")
        config = TransferConfig(
            multipart_threshold=self.multipart_bytes,
            multipart_chunksize=self.multipart_bytes,
            max_concurrency=MAX_CONCURRENCY,
        )
        tm = create_transfer_manager(self.client, config)
        watch = _progress_watch()
        futures: builtins.list[Any] = []
        total, ok = 0, False
        try:
            with _s3_errors(self._url(name)):
                for key in keys:
                    target = dest / key[len(name) + 1 :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    futures.append(
                        tm.download(self.bucket, self._key(key), str(target), subscribers=[watch])
                    )
                _wait_all(futures, watch, self.stall_timeout_s, self._url(name))
            total = sum(p.stat().st_size for p, _ in _local_files(dest))
            ok = True
        finally:
            if ok:
                tm.shutdown()
            else:
                for future in futures:
                    future.cancel()
                threading.Thread(target=tm.shutdown, kwargs={"cancel": True}, daemon=True).start()
        return total

    def move(self, src: str, dst: str) -> None:
        """Server-side copy of everything under `src` to `dst` (published with markers), then
        delete `src`."""
        if self.exists(dst):
            raise FileExistsError(errno.EEXIST, "already exists", self._url(dst))
        keys = self._keys_under(f"{src}/")
        if not keys:
            raise FileNotFoundError(errno.ENOENT, "nothing stored", self._url(src))
        self._put_marker(PENDING + dst)
        for key in keys:
            with _s3_errors(self._url(key)):
                self.client.copy(
                    {"Bucket": self.bucket, "Key": self._key(key)},
                    self.bucket,
                    self._key(dst + key[len(src) :]),
                )
        self._put_marker(COMMITS + dst, if_absent=True)
        self.delete(src)

    def _remove(self, name: str, keys: builtins.list[str]) -> None:
        self._delete_keys(keys)
        self._delete_keys([PENDING + name])

    def delete(self, key: str, *, background: bool = False) -> None:
        """An object: one DELETE. A name: pending marker, commit marker removed (the name is
        hidden from here on), its objects, the pending marker."""
        if self._is_object(key):
            self._delete_keys([key])
            return
        keys = self._keys_under(f"{key}/")
        if not keys or not self.exists(key):
            raise FileNotFoundError(errno.ENOENT, "nothing stored", self._url(key))
        self._put_marker(PENDING + key)
        self._delete_keys([COMMITS + key])
        if background:
            threading.Thread(target=self._remove, args=(key, keys), daemon=True).start()
        else:
            self._remove(key, keys)

    def clean_stale(self) -> builtins.list[str]:
        """Remove hidden names' objects and local staging directories; returns their names."""
        removed = sorted(self.hidden())
        for name in removed:
            self._remove(name, self._keys_under(f"{name}/"))
        if self.scratch.is_dir():
            for entry in sorted(self.scratch.iterdir()):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
        return removed


def check_reachable(location: str) -> None:
    """One listing request, so that a bad setup fails before any rank starts.

    Raises:
        UserError: One line for missing credentials, wrong credentials, a missing bucket, a
            refused access or an endpoint that does not answer.
    """
    where = parse_location(location)
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    head = f"checkpoint storage {where.url}"
    try:
        client().list_objects_v2(Bucket=where.bucket, Prefix=where.prefix, MaxKeys=1)
    except NoCredentialsError:
        raise UserError(
            f"{head}: no credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or AWS_PROFILE)"
        ) from None
    except EndpointConnectionError as e:
        raise UserError(f"{head}: endpoint unreachable ({e}); check AWS_ENDPOINT_URL") from None
    except ClientError as e:
        code = _code(e)
        reasons = {
            "NoSuchBucket": f"bucket {where.bucket} does not exist",
            "InvalidAccessKeyId": "wrong credentials (unknown access key id)",
            "SignatureDoesNotMatch": "wrong credentials (the secret key does not match)",
            "AccessDenied": "access denied to the bucket",
        }
        raise UserError(f"{head}: {reasons.get(code, f'S3 error {code}')}") from None
