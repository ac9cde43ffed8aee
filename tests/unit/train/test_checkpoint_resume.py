"""Real megatron-core checkpoints in one process: bit-exact resume, skipping, failures, signals.

Every run trains the tiny model (2 layers, hidden 64) on a small indexed dataset written here
with megatron-core's own builder, through the real runner (`llmctl.train.run_in_process`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from llmctl.config import compose
from llmctl.run import ckpt_store as store

# A signal sent once step 5 is logged reaches the handler within ~15 ms (5 ms polls, the
# GIL's 5 ms switch interval); the 19 steps left take >= 0.3 s even on a host 3x faster
# than the 2-core CI one (~40 ms a step with one thread), so it always lands mid-run.
ITERS = 24


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread for the whole module (the baseline and every run it is compared
    with): two OpenMP threads spinning against each other on a loaded 2-core host made a step
    take 0.6 s instead of 0.04 s (see the one_thread fixture in conftest.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 400-document indexed dataset (int32 tokens < 4096) with learnable sequences."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path_factory.mktemp("corpus") / "corpus"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(400):
        n, start, stride = (
            int(rng.integers(20, 200)),
            int(rng.integers(0, 4000)),
            int(rng.integers(1, 7)),
        )
        tokens = (start + stride * np.arange(n)) % 4000 + 1
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def _cfg(corpus: Path, iters: int, *extra: str):
    return compose(
        "tiny_cpu",
        [
            f"train.train_iters={iters}",
            "train.lr_decay_iters=12",
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
        if ps.model_parallel_is_initialized():  # a TrainingStopped skips the runner's teardown
            ps.destroy_model_parallel()


@pytest.fixture(scope="module")
def baseline(corpus: Path, tmp_path_factory: pytest.TempPathFactory):
    """An uninterrupted run with async checkpoints every 4 steps."""
    run_dir = tmp_path_factory.mktemp("baseline")
    result = _train(_cfg(corpus, ITERS, "checkpoint.keep_last=10"), run_dir)
    return run_dir, result.losses


def _copy_checkpoint(src: Path, dst: Path, step: int) -> None:
    name = store.iter_name(step)
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)


def test_saves_are_committed_and_valid(baseline) -> None:
    run_dir, losses = baseline
    root = run_dir / "checkpoints"
    assert len(losses) == ITERS
    assert store.committed_steps(root) == list(range(4, ITERS + 1, 4))
    assert store.read_latest(root) == ITERS
    for v in store.list_checkpoints(root, full=True):
        assert v.ok, v.problems
        assert v.manifest is not None and v.manifest["versions"]["megatron_core"]
    state = json.loads((root / "iter_0000008" / store.TRAIN_STATE).read_text())
    assert state["consumed_samples"] == 8 * 8 and state["scheduler"]["num_steps"] == 8


def test_resume_is_bit_exact(baseline, corpus: Path, tmp_path: Path) -> None:
    run_dir, losses = baseline
    _copy_checkpoint(run_dir, tmp_path, 4)  # the run "died" right after step 4 was committed
    # ... having logged steps 5 and 6 and half of 7 (kill -9 in the middle of a write).
    logged = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_text("".join(logged[:6]) + logged[6][:25])
    resumed = _train(_cfg(corpus, ITERS), tmp_path)
    assert resumed.losses == losses[4:]  # exact float equality on CPU
    assert store.committed_steps(tmp_path / "checkpoints")[-1] == ITERS
    # metrics.jsonl: every step once, in order; the died run's steps 5-7 set aside, not lost.
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, ITERS + 1))
    assert [r["loss"] for r in records[4:]] == losses[4:]
    superseded = (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in superseded[:2]] == [5, 6]
    assert superseded[2] == logged[6][:25]


def test_corrupt_newest_is_skipped(baseline, corpus: Path, tmp_path: Path) -> None:
    run_dir, losses = baseline
    for step in (4, 8):
        _copy_checkpoint(run_dir, tmp_path, step)
    shard = next((tmp_path / "checkpoints" / "iter_0000008").glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x55
    shard.write_bytes(bytes(data))
    v = store.validate(tmp_path / "checkpoints" / "iter_0000008")
    assert not v.ok and "checksum mismatch" in v.reason
    resumed = _train(_cfg(corpus, ITERS), tmp_path)
    assert resumed.losses == losses[4:]  # resumed from step 4, not the corrupt step 8


def test_failed_saves_do_not_kill_training(corpus: Path, tmp_path: Path) -> None:
    from llmctl.train.checkpoint import EXIT_SAVE_FAILED, TrainingStopped

    (tmp_path / "checkpoints").write_text("not a directory")  # every save fails with an OSError
    with pytest.raises(TrainingStopped) as stopped:  # the final save failed: not "finished"
        _train(_cfg(corpus, 6, "checkpoint.interval=2", "checkpoint.max_failed_saves=10"), tmp_path)
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # failed periodic saves did not stop training
    assert stopped.value.code == EXIT_SAVE_FAILED
    assert "the final checkpoint (step 6) failed" in stopped.value.message


def test_stop_after_max_failed_saves(corpus: Path, tmp_path: Path) -> None:
    from llmctl.train.checkpoint import EXIT_SAVE_FAILED, TrainingStopped

    (tmp_path / "checkpoints").write_text("not a directory")
    cfg = _cfg(corpus, 12, "checkpoint.interval=2", "checkpoint.max_failed_saves=2",
               "checkpoint.save_retries=1")  # fmt: skip
    with pytest.raises(TrainingStopped) as info:
        _train(cfg, tmp_path)
    assert info.value.code == EXIT_SAVE_FAILED
    assert "2 consecutive checkpoint saves failed" in info.value.message
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 5  # fail at 2, retry fails at 3 (save 1), fail at 4, retry at 5 (save 2)


@pytest.mark.parametrize(
    ("signum", "async_save"), [(signal.SIGUSR1, True), (signal.SIGTERM, False)]
)
def test_signal_checkpoints_then_resume_matches(
    baseline, corpus: Path, tmp_path: Path, signum: int, async_save: bool
) -> None:
    from llmctl.train.checkpoint import TrainingStopped

    _, losses = baseline
    metrics = tmp_path / "metrics.jsonl"

    ended = threading.Event()

    def preempt_after_step_5() -> None:  # like SLURM's --signal: arrives mid-run
        # No deadline of its own: on a slow host it waits as long as training takes to reach
        # step 5; it gives up only once training has ended (then pytest.raises fails).
        while not ended.wait(0.005):
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
                os.kill(os.getpid(), signum)
                return

    sender = threading.Thread(target=preempt_after_step_5, daemon=True)
    sender.start()
    before = signal.getsignal(signum)
    try:
        with pytest.raises(TrainingStopped) as info:  # sync saves at 4 must keep the handlers
            _train(_cfg(corpus, ITERS, f"checkpoint.async_save={async_save}"), tmp_path)
    finally:
        ended.set()
        sender.join()
    assert info.value.code == 128 + signum
    stopped_at = store.read_latest(tmp_path / "checkpoints")
    assert stopped_at is not None and 5 <= stopped_at < ITERS
    assert signal.getsignal(signum) is before  # the checkpointer gave the signal back
    resumed = _train(_cfg(corpus, ITERS), tmp_path)
    assert resumed.losses == losses[stopped_at:]
