"""The S3 backend against a real SeaweedFS server: parts, the commit marker, cut-off uploads,
retention and the one-line errors. The interface's own assertions run in test_ckpt_storage.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import llmctl
from llmctl.errors import UserError
from llmctl.run import ckpt_store as store
from llmctl.run.storage_s3 import COMMITS, PENDING, S3Storage, check_reachable

pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")

WORLD = 1


def _fake_checkpoint(root: Path, step: int, shard_bytes: int = 4096) -> Path:
    """A committed one-rank checkpoint with the files validation requires (no torch)."""
    tmp = store.staging_dir(root, step)
    (tmp / store.RNG_DIR).mkdir(parents=True)
    (tmp / "__0_0.distcp").write_bytes(os.urandom(shard_bytes))
    (tmp / store.RNG_DIR / "rank_0.json").write_text("{}")
    store.write_rank_marker(tmp, 0, store.rank_files(tmp, 0))
    (tmp / "metadata.json").write_text("{}")
    (tmp / store.TRAIN_STATE).write_text(json.dumps({"step": step}))
    (tmp / ".metadata").write_bytes(b"x")
    manifest = store.build_manifest(tmp, WORLD, {"step": step, "world_size": WORLD})
    return store.commit(root, tmp, step, manifest)


def _keys(s3: S3Storage, under: str) -> list[str]:
    return s3._keys_under(under)


def test_a_large_file_goes_up_in_parallel_parts(s3_url: str, tmp_path: Path) -> None:
    s3 = S3Storage(s3_url, scratch=tmp_path / "scratch", multipart_bytes=5 << 20)
    staging = s3.staging_dir("iter_0000001")
    staging.mkdir(parents=True)
    data = os.urandom((12 << 20) + 123)
    (staging / "__0_0.distcp").write_bytes(data)
    s3.commit(staging, "iter_0000001")
    head = s3.client.head_object(Bucket=s3.bucket, Key=s3._key("iter_0000001/__0_0.distcp"))
    assert head["ETag"].strip('"').endswith("-3"), "not a 3-part multipart upload"
    assert b"".join(s3.read_chunks("iter_0000001/__0_0.distcp", 1 << 20)) == data


def test_the_commit_marker_is_a_conditional_put(s3_url: str, tmp_path: Path) -> None:
    """Two writers that both passed the existence check: the server lets one commit."""
    s3 = S3Storage(s3_url, scratch=tmp_path)
    s3._put_marker(COMMITS + "iter_0000002", if_absent=True)
    with pytest.raises(FileExistsError, match="already committed"):
        s3._put_marker(COMMITS + "iter_0000002", if_absent=True)


def test_the_protocol_on_s3(s3_url: str) -> None:
    """Commit, latest, listing, validation (CRCs read back), move-aside, from `s3://` alone."""
    root = Path(s3_url)  # what callers hold: `Path` turns it into `s3:/ckpt/...`
    for step in (1, 2, 3):
        _fake_checkpoint(root, step)
    assert store.committed_steps(root) == [1, 2, 3] and store.read_latest(root) == 3
    assert [v.ok for v in store.list_checkpoints(root)] == [True, True, True]
    s3 = S3Storage(s3_url)
    s3.write_bytes("iter_0000003/__0_0.distcp", b"\0" * 4096)  # same size: only the CRC sees it
    assert store.validate(root / "iter_0000003", full=True).problems == [
        "__0_0.distcp: checksum mismatch"
    ]
    # every CRC of step 2 read back equal: the only complaint is the fake torch `.metadata`
    assert [p[:18] for p in store.validate(root / "iter_0000002").problems] == [
        ".metadata rejected"
    ]
    s3.write_bytes("iter_0000003/__0_0.distcp", b"short")
    valid, skipped = store.newest_valid(root, full=False)
    assert [v.reason for v in skipped] == ["__0_0.distcp: size 5 != 4096 in manifest"]
    assert valid is not None and valid.step == 2
    store.move_aside(skipped[0].path, skipped[0].reason)
    assert store.committed_steps(root) == [1, 2]
    assert s3.list(f"{store.INVALID_DIR}/") == ["iter_0000003.reason.txt", "iter_0000003/"]


_UPLOADER = """
import json, os, sys
from pathlib import Path
from llmctl.run import ckpt_store as store
root, step = Path(sys.argv[1]), int(sys.argv[2])
tmp = store.staging_dir(root, step)
(tmp / store.RNG_DIR).mkdir(parents=True)
for i in range(16):
    (tmp / f"__0_{i}.distcp").write_bytes(os.urandom(8 << 20))
(tmp / store.RNG_DIR / "rank_0.json").write_text("{}")
store.write_rank_marker(tmp, 0, store.rank_files(tmp, 0))
for name in ("metadata.json", ".metadata"):
    (tmp / name).write_text("{}")
(tmp / store.TRAIN_STATE).write_text(json.dumps({"step": step}))
manifest = store.build_manifest(tmp, 1, {"step": step, "world_size": 1})
store.commit(root, tmp, step, manifest)
"""


def _wait_for(cond: Callable[[], object], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.slow
def test_an_upload_killed_before_its_marker_is_never_selected(
    s3_url: str, s3_server_factory: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of the server mid-upload (and of the uploader), restart on the same data."""
    server = s3_server_factory()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    env = {**os.environ, "PYTHONPATH": str(Path(llmctl.__file__).parents[1])}
    root = Path(s3_url)
    for step in (1, 2):
        _fake_checkpoint(root, step)
    s3 = S3Storage(s3_url)
    uploader = subprocess.Popen([sys.executable, "-c", _UPLOADER, s3_url, "3"], env=env)
    try:
        _wait_for(lambda: _keys(s3, f"{PENDING}iter_0000003") or uploader.poll() is not None)
        _wait_for(lambda: _keys(s3, "iter_0000003/") or uploader.poll() is not None)
        server.process.send_signal(signal.SIGKILL)  # mid-upload: some objects are in
    finally:
        uploader.kill()
        uploader.wait()
    server.restart()
    s3 = S3Storage(s3_url)
    assert _keys(s3, "iter_0000003/"), "nothing of step 3 was uploaded: the test proved nothing"
    assert not _keys(s3, f"{COMMITS}iter_0000003"), "the upload finished before the kill"
    assert store.committed_steps(root) == [1, 2] and "iter_0000003/" not in s3.list()
    assert not s3.exists("iter_0000003") and store.read_latest(root) == 2
    valid, skipped = store.newest_valid(root, full=False)
    assert valid is not None and valid.step == 2 and skipped == []
    assert "iter_0000003" in store.clean_stale(root)
    assert _keys(s3, "iter_0000003/") == [] and _keys(s3, f"{PENDING}iter_0000003") == []
    _fake_checkpoint(root, 3)  # the step can be saved again
    assert store.committed_steps(root) == [1, 2, 3]


def test_retention_deletes_only_older_committed_checkpoints(s3_url: str) -> None:
    root = Path(s3_url)
    for step in (1, 2, 3, 4):
        _fake_checkpoint(root, step)
    s3 = S3Storage(s3_url)
    s3.write_bytes(f"{PENDING}iter_0000005", b"")  # an upload cut off before its marker
    s3.write_bytes("iter_0000005/__0_0.distcp", b"half")
    assert store.committed_steps(root) == [1, 2, 3, 4]
    assert store.apply_retention(root, keep_last=2, keep_every=None) == [1, 2]
    assert store.committed_steps(root) == [3, 4]
    assert _keys(s3, "iter_0000001/") == [] and _keys(s3, "iter_0000002/") == []
    assert s3.read_bytes("iter_0000005/__0_0.distcp") == b"half"  # not retention's to delete
    valid, _ = store.newest_valid(root, full=False)
    assert valid is not None and valid.step == 4


def test_no_secret_reaches_the_store_or_the_scratch(s3_url: str, s3_server: Any) -> None:
    root = Path(s3_url)
    _fake_checkpoint(root, 1)
    s3 = S3Storage(s3_url)
    blobs = [s3.read_bytes(k) for k in s3._keys_under("")]
    assert blobs and not any(s3_server.secret_key.encode() in b for b in blobs)
    assert not any(p.is_file() for p in s3.scratch.rglob("*"))  # staging consumed


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"AWS_SECRET_ACCESS_KEY": "wrong"}, "wrong credentials (the secret key does not match)"),
        ({"AWS_ACCESS_KEY_ID": "nobody"}, "wrong credentials (unknown access key id)"),
        ({}, "bucket nobucket does not exist"),
    ],
)
def test_bad_setups_are_one_line_errors(
    s3_url: str, monkeypatch: pytest.MonkeyPatch, change: dict[str, str], message: str
) -> None:
    for name, value in change.items():
        monkeypatch.setenv(name, value)
    url = s3_url if change else "s3://nobucket/run"
    with pytest.raises(UserError) as err:
        check_reachable(url)
    assert str(err.value) == f"checkpoint storage {url}: {message}"
    with pytest.raises(OSError, match=r"S3 (SignatureDoesNotMatch|InvalidAccessKeyId|NoSuchB)"):
        S3Storage(url).list()


def test_an_endpoint_that_does_not_answer_is_one_line(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(UserError, match=r"endpoint unreachable .*check AWS_ENDPOINT_URL$") as err:
        check_reachable(s3_url)
    assert "\n" not in str(err.value)


def test_llmctl_checkpoints_lists_and_validates_an_s3_location(s3_url: str) -> None:
    from typer.testing import CliRunner

    from llmctl.cli.main import app

    root = Path(s3_url)
    for step in (2, 4):
        _fake_checkpoint(root, step)
    S3Storage(s3_url).delete(f"{store.iter_name(4)}/{store.TRAIN_STATE}")
    result = CliRunner().invoke(app, ["checkpoints", s3_url, "--json", "--quick"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["step"], r["valid"], r["latest"], r["path"]) for r in rows] == [
        (4, False, True, f"{s3_url}/iter_0000004"),
        (2, True, False, f"{s3_url}/iter_0000002"),
    ]
    assert "missing file train_state.json" in rows[0]["problems"]
    table = CliRunner().invoke(app, ["checkpoints", s3_url, "--quick"])
    assert table.exit_code == 0 and "(latest)" in table.output, table.output
    missing = CliRunner().invoke(app, ["checkpoints", "s3://nobucket/x", "--quick"])
    assert missing.exit_code == 2
    assert "checkpoint storage s3://nobucket/x: bucket nobucket does not exist" in missing.output


@pytest.mark.slow
def test_a_stalled_server_fails_the_commit_in_bounded_time(
    s3_url: str,
    s3_server_factory: Callable[[], Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """SIGSTOP of the server mid-upload: the commit gives up after `stall_timeout_s`, hidden."""
    server = s3_server_factory()
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    s3 = S3Storage(s3_url, scratch=tmp_path, multipart_bytes=5 << 20, stall_timeout_s=3)
    staging = s3.staging_dir("iter_0000001")
    staging.mkdir(parents=True)
    for i in range(8):
        (staging / f"__0_{i}.distcp").write_bytes(os.urandom(8 << 20))
    watcher = S3Storage(s3_url)
    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            s3.commit(staging, "iter_0000001")
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=commit)
    thread.start()
    _wait_for(lambda: _keys(watcher, f"{PENDING}iter_0000001") or not thread.is_alive())
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    thread.join(timeout=120)
    waited_s = time.monotonic() - stopped
    print("WAITED", waited_s, repr(outcome))
    server.process.send_signal(signal.SIGCONT)
    assert not thread.is_alive(), "the commit hung on a stopped server"
    assert isinstance(outcome[0], TimeoutError), outcome
    assert "upload stalled: no progress for 3 s" in str(outcome[0])
    assert waited_s < 10, f"a stalled commit took {waited_s:.1f} s to fail (stall bound: 3 s)"
    assert "iter_0000001/" not in watcher.list() and not watcher.exists("iter_0000001")
    assert watcher.hidden() == {"iter_0000001"}
