"""Training with `checkpoint.dir=s3://...` against a real SeaweedFS server, in one process.

The real runner (`run_in_process`) trains the tiny model; its checkpoints are saved locally,
uploaded by the background uploader and committed in the store with the conditional-PUT marker.
The oracles: the store's listing and full CRC32 validation (`ckpt_store`), the run's own
`uploads.json`, and an uninterrupted reference run whose loss at every step must be equal
(exact float equality on CPU) to the resumed run's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")

from fs_faults import fill

from llmctl.config import compose
from llmctl.run import ckpt_store as store
from llmctl.run.ckpt_upload import read_uploads

ITERS = 12


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread for every run of the module (see conftest.one_thread)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 400-document indexed dataset (megatron-core's own builder)."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path_factory.mktemp("corpus") / "corpus"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(400):
        n, start = int(rng.integers(20, 200)), int(rng.integers(0, 4000))
        tokens = (start + int(rng.integers(1, 7)) * np.arange(n)) % 4000 + 1
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def _cfg(corpus: Path, iters: int, *extra: str):
    return compose(
        "tiny_cpu",
        [
            f"train.train_iters={iters}",
            f"train.lr_decay_iters={ITERS}",
            "train.warmup_iters=2",
            "train.lr=3e-3",
            "train.log_interval=1",
            "train.eval_interval=0",
            f"data.prefixes=[{corpus}]",
            f"data.cache_dir={corpus.parent / 'cache'}",
            "checkpoint.interval=4",
            *extra,
        ],
    )


def _train(cfg, run_dir: Path):
    from megatron.core import parallel_state as ps

    from llmctl.train import run_in_process

    try:
        return run_in_process(cfg, run_dir)
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """An uninterrupted run of ITERS steps (checkpoints on local disk)."""
    return list(_train(_cfg(corpus, ITERS), tmp_path_factory.mktemp("reference")).losses)


def _point_at(server, monkeypatch) -> None:
    """The standard AWS variables of this process point at `server` (and only there)."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)


def _files_with(run_dir: Path, secret: bytes) -> list[str]:
    return [
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.is_file() and secret in p.read_bytes()
    ]


def test_a_fresh_run_dir_resumes_from_the_store_bit_exact(
    corpus: Path, reference: list[float], s3_url: str, tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="llmctl.train.checkpoint")
    first, fresh = tmp_path / "node-a", tmp_path / "node-b"
    losses = _train(_cfg(corpus, 8, f"checkpoint.dir={s3_url}"), first).losses
    assert losses == reference[:8]
    root = Path(s3_url)
    assert store.committed_steps(root) == [4, 8] and store.read_latest(root) == 8
    assert all(v.ok for v in store.list_checkpoints(root, full=True))
    assert store.committed_steps(first / "checkpoints") == []  # uploaded, local copy pruned
    state = read_uploads(first)
    assert state is not None and state["backend"] == s3_url and state["in_flight"] is None
    assert state["last_committed"]["step"] == 8 and state["last_error"] is None
    secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
    assert _files_with(first, secret) == []  # no file the run wrote holds the secret key

    # a replacement node: an empty run directory, the same recipe and checkpoint.dir
    resumed = _train(_cfg(corpus, ITERS, f"checkpoint.dir={s3_url}"), fresh)
    assert resumed.losses == reference[8:]  # resumed at step 8, bit-exact afterwards
    assert f"checkpoint iter_0000008 of {s3_url}: downloaded" in caplog.text
    assert store.committed_steps(root) == [8, 12]  # retention: only older committed ones went
    assert _files_with(fresh, secret) == []

    # what a launch into this run directory will load is read from the store (resume works
    # with no local checkpoint), and a config the checkpoint cannot take is refused there
    from llmctl.config import cfg_to_yaml
    from llmctl.errors import UserError
    from llmctl.launch.reentry import inspect_run_dir
    from llmctl.run.layout import resolve_layout

    same = _cfg(corpus, 16, f"checkpoint.dir={s3_url}", f"train.run_dir={fresh}")
    (fresh / "config.yaml").write_text(cfg_to_yaml(same))  # what `llmctl train` writes
    point = inspect_run_dir(same, resolve_layout(same, None, None), restart_from_scratch=False)
    assert point is not None and point.step == 12
    other = _cfg(corpus, 16, f"checkpoint.dir={s3_url}", f"train.run_dir={fresh}",
                 "model.num_layers=3")  # fmt: skip
    with pytest.raises(UserError, match="num_layers"):
        inspect_run_dir(other, resolve_layout(other, None, None), restart_from_scratch=False)


def test_keep_local_loads_the_identical_local_copy(
    corpus: Path, reference: list[float], s3_url: str, tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="llmctl.train.checkpoint")
    run_dir = tmp_path / "run"
    extra = (f"checkpoint.dir={s3_url}", "checkpoint.keep_local=true")
    _train(_cfg(corpus, 8, *extra), run_dir)
    assert store.committed_steps(run_dir / "checkpoints") == [8]  # the newest, kept locally
    resumed = _train(_cfg(corpus, ITERS, *extra), run_dir)
    assert resumed.losses == reference[8:]
    assert f"checkpoint iter_0000008 of {s3_url}: local copy" in caplog.text
    # a local copy that differs from the store's is set aside, and the store's is downloaded
    local = run_dir / "checkpoints" / "iter_0000012"
    manifest = json.loads((local / store.MANIFEST).read_text())
    manifest["created_unix"] = 0.0
    (local / store.MANIFEST).write_text(json.dumps(manifest))
    _train(_cfg(corpus, ITERS, *extra), run_dir)  # nothing left to train: loads and ends
    assert f"checkpoint iter_0000012 of {s3_url}: downloaded" in caplog.text
    assert (run_dir / "checkpoints" / store.INVALID_DIR / "iter_0000012").is_dir()


@pytest.mark.slow
def test_a_stopped_server_fails_the_upload_in_bounded_time(
    corpus: Path, reference: list[float], s3_server_factory, monkeypatch, tmp_path: Path, caplog
) -> None:
    """SIGSTOP of the server while the upload of step 4 is in flight: the upload fails after
    `upload_timeout_s`, the failed-save policy logs one line per failure, the final save fails
    with exit code 3; after a restart of the server on the same data nothing partial is
    listed and a fresh run directory resumes from step 2, the newest committed one."""
    from llmctl.train.checkpoint import EXIT_SAVE_FAILED, TrainingStopped

    caplog.set_level(logging.INFO, logger="llmctl.train.checkpoint")
    server = s3_server_factory()
    _point_at(server, monkeypatch)
    url = f"s3://{server.bucket}/stop/checkpoints"
    run_dir = tmp_path / "run"
    extra = (
        f"checkpoint.dir={url}", "checkpoint.interval=2", "checkpoint.upload_timeout_s=2",
        "checkpoint.max_failed_saves=10",
    )  # fmt: skip
    stopped_at: list[float] = []
    done = threading.Event()

    def stop_during_upload_of_4() -> None:
        while not done.wait(0.002):
            state = read_uploads(run_dir) or {}
            if (state.get("in_flight") or {}).get("step") == 4:
                assert server.process is not None
                server.process.send_signal(signal.SIGSTOP)
                stopped_at.append(time.monotonic())
                return

    watcher = threading.Thread(target=stop_during_upload_of_4, daemon=True)
    watcher.start()
    try:
        with pytest.raises(TrainingStopped) as info:
            _train(_cfg(corpus, 6, *extra), run_dir)
        ended = time.monotonic()
    finally:
        done.set()
        watcher.join()
    assert stopped_at, "the upload of step 4 was never seen in flight"
    assert info.value.code == EXIT_SAVE_FAILED
    assert "the final checkpoint (step 6) failed" in info.value.message
    assert "the newest complete checkpoint is step 2" in info.value.message
    # bounded: each failed upload ends within a few request timeouts of 2 s (4 uploads here)
    assert ended - stopped_at[0] < 90
    failed = [line for line in caplog.messages if "checkpoint at step 4 failed (upload" in line]
    assert len(failed) == 1 and "retrying at the next step" in failed[0]
    state = read_uploads(run_dir)
    assert state is not None and state["last_committed"]["step"] == 2
    assert state["last_error"]["step"] == 6

    server.restart()  # SIGCONT + SIGTERM, then a new server on the same data directory
    root = Path(url)
    assert store.committed_steps(root) == [2]  # no half-uploaded checkpoint is listed
    assert [v.ok for v in store.list_checkpoints(root, full=True)] == [True]
    fresh = tmp_path / "fresh"
    resumed = _train(_cfg(corpus, ITERS, *extra[:2]), fresh)
    assert resumed.losses == reference[2:]
    assert f"checkpoint iter_0000002 of {url}: downloaded" in caplog.text


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 64 MiB tmpfs of this test's own (root and mount(8) needed); unmounted afterwards."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a small filesystem under the server")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_a_full_disk_under_the_server_fails_uploads_and_loses_nothing_committed(
    corpus: Path,
    reference: list[float],
    s3_server_factory,
    small_disk: Path,
    monkeypatch,
    tmp_path: Path,
    caplog,
) -> None:
    """The server's data folder fills up to the last byte once step 2 is committed: the
    server answers every later upload with an error, each failure goes through the failed-save
    policy, the final save fails with exit code 3 naming the newest complete checkpoint;
    with the space freed and the server restarted on the same data, every committed
    checkpoint validates, nothing partial is listed, and a fresh run directory resumes from
    the newest committed step bit-exact."""
    from llmctl.train.checkpoint import EXIT_SAVE_FAILED, TrainingStopped

    caplog.set_level(logging.INFO, logger="llmctl.train.checkpoint")
    server = s3_server_factory(data_dir=small_disk / "data")
    _point_at(server, monkeypatch)
    url = f"s3://{server.bucket}/full/checkpoints"
    run_dir = tmp_path / "run"
    extra = (
        f"checkpoint.dir={url}", "checkpoint.interval=2", "checkpoint.upload_timeout_s=20",
        "checkpoint.max_failed_saves=10",
    )  # fmt: skip
    filled: list[int] = []
    done = threading.Event()

    def fill_after_2() -> None:
        while not done.wait(0.002):
            state = read_uploads(run_dir) or {}
            if ((state.get("last_committed") or {}).get("step") or 0) >= 2:
                fill(small_disk)
                filled.append(int(state["last_committed"]["step"]))
                return

    watcher = threading.Thread(target=fill_after_2, daemon=True)
    watcher.start()
    try:
        with pytest.raises(TrainingStopped) as info:
            _train(_cfg(corpus, 6, *extra), run_dir)
    finally:
        done.set()
        watcher.join()
    assert filled == [2], "the disk was not filled right after the commit of step 2"
    assert info.value.code == EXIT_SAVE_FAILED
    assert "the final checkpoint (step 6) failed" in info.value.message
    state = read_uploads(run_dir)
    assert state is not None and state["last_error"]["step"] == 6
    newest = int(state["last_committed"]["step"])
    assert newest in (2, 4)  # step 4's upload may have been past its last PUT when the disk filled
    assert f"the newest complete checkpoint is step {newest}" in info.value.message
    failed = [m for m in caplog.messages if "failed (upload" in m]
    assert failed, "no upload failure went through the failed-save policy"

    (small_disk / "filler").unlink()
    server.restart()  # on the same data directory, now with room
    root = Path(url)
    assert store.committed_steps(root)[-1] == newest  # nothing partial is listed
    assert all(v.ok for v in store.list_checkpoints(root, full=True))
    fresh = tmp_path / "fresh"
    resumed = _train(_cfg(corpus, ITERS, *extra[:2]), fresh)
    assert resumed.losses == reference[newest:]
    assert f"checkpoint iter_{newest:07d} of {url}: downloaded" in caplog.text
