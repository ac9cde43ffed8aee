"""The checkpoint storage interface: the same assertions on every backend, no torch.

`BACKENDS` is the parametrisation a new backend joins: POSIX, `MemoryStorage` below (a
reference implementation with object store semantics: no directories, no rename; running the
commit protocol on it shows that `ckpt_store` reaches committed checkpoints only through the
interface) and `S3Storage` on a real SeaweedFS server (the `s3_url` fixture, a fresh prefix
per test).
"""

from __future__ import annotations

import builtins
import json
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.run import ckpt_store as store
from llmctl.run.storage import CheckpointStorage, storage_for
from llmctl.run.storage_posix import PosixStorage


class MemoryStorage:
    """Objects in a dict and a local scratch directory for staging: what an S3 backend has."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.objects: dict[str, bytes] = {}

    def list(self, prefix: str = "") -> builtins.list[str]:
        names = set()
        for key in self.objects:
            if key.startswith(prefix):
                head, sep, _ = key[len(prefix) :].partition("/")
                names.add(head + sep)
        return sorted(names)

    def exists(self, key: str) -> bool:
        return key in self.objects or any(k.startswith(f"{key}/") for k in self.objects)

    def _get(self, key: str) -> bytes:
        if key not in self.objects:
            raise FileNotFoundError(key)
        return self.objects[key]

    def size(self, key: str) -> int:
        return len(self._get(key))

    def read_bytes(self, key: str) -> bytes:
        return self._get(key)

    def read_chunks(self, key: str, chunk_bytes: int) -> Iterator[bytes]:
        data = self._get(key)
        for i in range(0, len(data), chunk_bytes):
            yield data[i : i + chunk_bytes]

    def write_bytes(self, key: str, data: bytes) -> None:
        self.objects[key] = bytes(data)

    def staging_dir(self, name: str) -> Path:
        return self.scratch / name

    def commit(self, staging: Path, name: str) -> None:
        if self.exists(name):
            raise FileExistsError(name)
        files = {
            f"{name}/{p.relative_to(staging).as_posix()}": p.read_bytes()
            for p in staging.rglob("*")
            if p.is_file()
        }
        self.objects.update(files)  # all at once: the conditional PUT of a marker
        shutil.rmtree(staging)

    def _under(self, key: str) -> builtins.list[str]:
        return [k for k in self.objects if k == key or k.startswith(f"{key}/")]

    def move(self, src: str, dst: str) -> None:
        if self.exists(dst):
            raise FileExistsError(dst)
        keys = self._under(src)
        if not keys:
            raise FileNotFoundError(src)
        for k in keys:
            self.objects[dst + k[len(src) :]] = self.objects.pop(k)

    def delete(self, key: str, *, background: bool = False) -> None:
        keys = self._under(key)
        if not keys:
            raise FileNotFoundError(key)
        for k in keys:
            del self.objects[k]

    def clean_stale(self) -> builtins.list[str]:
        names = sorted(p.name for p in self.scratch.iterdir()) if self.scratch.is_dir() else []
        shutil.rmtree(self.scratch, ignore_errors=True)
        return names


def _posix(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    return PosixStorage(tmp_path / "checkpoints")


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    return MemoryStorage(tmp_path / "scratch")


def _s3(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    from llmctl.run.storage_s3 import S3Storage

    url = request.getfixturevalue("s3_url")  # skips, saying why, without the `weed` binary
    return S3Storage(url, scratch=tmp_path / "scratch", multipart_bytes=5 << 20)


BACKENDS: list[Callable[[pytest.FixtureRequest, Path], CheckpointStorage]] = [
    _posix,
    _memory,
    _s3,
]


@pytest.fixture(params=BACKENDS, ids=lambda f: f.__name__.lstrip("_"))
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    backend: Callable[[pytest.FixtureRequest, Path], CheckpointStorage] = request.param
    return backend(request, tmp_path)


def _stage(storage: CheckpointStorage, name: str, files: dict[str, bytes]) -> Path:
    staging = storage.staging_dir(name)
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    return staging


def test_write_read_size_exists(storage: CheckpointStorage) -> None:
    assert storage.list() == [] and not storage.exists("latest")
    storage.write_bytes("latest", b"10\n")
    storage.write_bytes("latest", b"20\n")  # replaces
    assert storage.read_bytes("latest") == b"20\n"
    assert storage.size("latest") == 3 and storage.exists("latest")
    storage.write_bytes("invalid/iter_0000001.reason.txt", b"why\n")  # no parent needed first
    assert storage.read_bytes("invalid/iter_0000001.reason.txt") == b"why\n"
    for missing in (storage.read_bytes, storage.size):
        with pytest.raises(FileNotFoundError):
            missing("nope")
    with pytest.raises(FileNotFoundError):
        list(storage.read_chunks("nope", 4))


def test_read_chunks_stream_the_whole_object(storage: CheckpointStorage) -> None:
    data = bytes(range(256)) * 41
    storage.write_bytes("blob", data)
    chunks = list(storage.read_chunks("blob", 1000))
    assert b"".join(chunks) == data and max(map(len, chunks)) <= 1000


def test_list_names_objects_and_prefixes(storage: CheckpointStorage) -> None:
    storage.write_bytes("latest", b"1\n")
    storage.commit(
        _stage(storage, "iter_0000001", {"a": b"1", "rng/rank_0.json": b"{}"}), "iter_0000001"
    )
    assert [n for n in storage.list() if not n.startswith(".")] == ["iter_0000001/", "latest"]
    assert storage.list("iter_0000001/") == ["a", "rng/"]
    assert storage.list("iter_0000001/rng/") == ["rank_0.json"]
    assert storage.list("iter_0000009/") == []
    assert storage.exists("iter_0000001") and storage.exists("iter_0000001/rng/rank_0.json")


def test_commit_publishes_the_staging_directory(storage: CheckpointStorage) -> None:
    staging = _stage(storage, "iter_0000002", {"__0_0.distcp": b"x" * 100, "sub/f": b"y"})
    assert "iter_0000002/" not in storage.list() and not storage.exists("iter_0000002")
    storage.commit(staging, "iter_0000002")
    assert "iter_0000002/" in storage.list()
    assert storage.read_bytes("iter_0000002/__0_0.distcp") == b"x" * 100
    assert storage.read_bytes("iter_0000002/sub/f") == b"y"


def test_commit_is_create_if_absent(storage: CheckpointStorage) -> None:
    storage.commit(_stage(storage, "iter_0000003", {"f": b"first"}), "iter_0000003")
    second = _stage(storage, "iter_0000003", {"f": b"second"})
    with pytest.raises(FileExistsError):
        storage.commit(second, "iter_0000003")
    assert storage.read_bytes("iter_0000003/f") == b"first"


def test_a_write_is_never_seen_half_done(storage: CheckpointStorage) -> None:
    old, new = b"a" * (1 << 20), b"b" * (1 << 20)
    storage.write_bytes("obj", old)
    seen: set[bytes] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(storage.read_bytes("obj")[:: 1 << 16])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20):
            storage.write_bytes("obj", new if i % 2 == 0 else old)
    finally:
        done.set()
        reader.join()
    assert seen <= {old[:: 1 << 16], new[:: 1 << 16]}, "a reader saw a mix of two writes"


@pytest.mark.parametrize("background", [False, True])
def test_delete_a_checkpoint_and_an_object(storage: CheckpointStorage, background: bool) -> None:
    storage.commit(_stage(storage, "iter_0000004", {"f": b"1", "d/g": b"2"}), "iter_0000004")
    storage.write_bytes("latest", b"4\n")
    storage.delete("iter_0000004", background=background)
    assert "iter_0000004/" not in storage.list() and not storage.exists("iter_0000004")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("iter_0000004/f")
    storage.delete("latest")
    assert not storage.exists("latest")
    with pytest.raises(FileNotFoundError):
        storage.delete("iter_0000004")


def test_move_sets_a_checkpoint_aside(storage: CheckpointStorage) -> None:
    storage.commit(_stage(storage, "iter_0000005", {"f": b"5"}), "iter_0000005")
    storage.move("iter_0000005", "invalid/iter_0000005")
    assert "iter_0000005/" not in storage.list() and "invalid/" in storage.list()
    assert storage.read_bytes("invalid/iter_0000005/f") == b"5"
    storage.commit(_stage(storage, "iter_0000005", {"f": b"again"}), "iter_0000005")
    with pytest.raises(FileExistsError):
        storage.move("iter_0000005", "invalid/iter_0000005")


def test_clean_stale_drops_uncommitted_staging(storage: CheckpointStorage) -> None:
    storage.commit(_stage(storage, "iter_0000006", {"f": b"6"}), "iter_0000006")
    _stage(storage, "iter_0000007", {"f": b"half"})  # a save interrupted before its commit
    assert "iter_0000007/" not in storage.list()
    assert storage.clean_stale()
    assert storage.list() == ["iter_0000006/"]
    assert not storage.staging_dir("iter_0000007").exists()


def test_storage_for_picks_the_backend_by_location(tmp_path: Path) -> None:
    assert isinstance(storage_for(tmp_path), PosixStorage)
    assert isinstance(storage_for(str(tmp_path)), PosixStorage)
    with pytest.raises(UserError, match=r"gs://bucket/run: gs:// is not supported"):
        storage_for("gs://bucket/run")
    pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")
    from llmctl.run.storage_s3 import S3Storage

    for where in ("s3://bucket/run/checkpoints", Path("s3://bucket/run/checkpoints")):
        s3 = storage_for(where)  # a Path keeps `s3:/bucket/...`: the same location
        assert isinstance(s3, S3Storage)
        assert (s3.bucket, s3.location.prefix) == ("bucket", "run/checkpoints")
    with pytest.raises(UserError, match="no bucket"):
        storage_for("s3://")


def _fake_checkpoint(root: Path, step: int) -> Path:
    """A committed checkpoint of one rank with the files validation requires."""
    tmp = store.staging_dir(root, step)
    (tmp / store.RNG_DIR).mkdir(parents=True)
    (tmp / "__0_0.distcp").write_bytes(bytes(range(256)) * (step + 1))
    (tmp / store.RNG_DIR / "rank_0.json").write_text("{}")
    store.write_rank_marker(tmp, 0, store.rank_files(tmp, 0))
    (tmp / "metadata.json").write_text("{}")
    (tmp / store.TRAIN_STATE).write_text(json.dumps({"step": step}))
    (tmp / ".metadata").write_bytes(b"x")
    manifest = store.build_manifest(tmp, 1, {"step": step, "world_size": 1})
    return store.commit(root, tmp, step, manifest)


def test_the_protocol_reaches_checkpoints_only_through_the_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commit, latest, listing, validation, move-aside and retention on an object store."""
    root = tmp_path / "bucket" / "checkpoints"  # never created: nothing may touch it
    mem = MemoryStorage(tmp_path / "scratch")
    monkeypatch.setattr(store, "storage_for", lambda where: mem)
    for step in (1, 2, 3):
        assert _fake_checkpoint(root, step) == root / store.iter_name(step)
    assert store.committed_steps(root) == [1, 2, 3] and store.read_latest(root) == 3
    assert all(v.ok for v in store.list_checkpoints(root))
    shard = "iter_0000003/__0_0.distcp"
    mem.objects[shard] = b"\0" * mem.size(shard)  # same size: only the CRC32 sees it
    assert store.validate(root / "iter_0000003", full=True).reason == (
        "__0_0.distcp: checksum mismatch"
    )
    mem.objects[shard] = b"short"
    valid, skipped = store.newest_valid(root, full=False)
    assert skipped[0].reason.startswith("__0_0.distcp: size 5 != ")
    assert valid is not None and valid.step == 2
    moved = store.move_aside(skipped[0].path, skipped[0].reason)
    assert moved == root / store.INVALID_DIR / "iter_0000003"
    assert mem.read_bytes("invalid/iter_0000003.reason.txt") == (skipped[0].reason + "\n").encode()
    assert store.apply_retention(root, keep_last=1, keep_every=None) == [1]
    assert store.committed_steps(root) == [2]
    _fake_checkpoint(root, 2)  # a same-step save replaces (and keeps) the old one
    assert mem.exists("invalid/iter_0000002/manifest.json") and store.committed_steps(root) == [2]
    assert store.clean_stale(root) == [] and not root.exists()
