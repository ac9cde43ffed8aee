"""Multi-process checkpoints: TP1 -> TP2 resharding on resume; torchrun restarts after kill -9.

Resharding: a TP=1 run (one process) trains 8 steps with checkpoints every 2; a second run
directory gets its step-4 checkpoint and trains to step 8 with TP=2 under torchrun. Its losses
match the TP=1 run to 1e-5 (TP=2 splits the GEMMs and reductions, so the last bits differ).

Restarts: a DP=2 run under `torchrun --max-restarts=1`; once it has committed a checkpoint, one
rank is killed with SIGKILL; torchrun brings the group back and the ranks resume from the
newest complete checkpoint by themselves and finish.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
psutil = pytest.importorskip("psutil")

from ckpt_support import (  # noqa: E402
    base_overrides,
    kill_tree,
    losses,
    make_corpus,
    start_entry,
    write_run,
)

from llmctl.config import load_resolved  # noqa: E402
from llmctl.run import ckpt_store as store  # noqa: E402

ITERS = 8
KILL_ITERS = 24  # steps left after the kill at 3: a fast host must still be training


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared indexed dataset of this module."""
    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


def _wait(proc, timeout_s: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except Exception:
        kill_tree(proc)
        raise


def _kill_one_rank_after(run_dir: Path, proc, step: int, timeout_s: float = 120) -> None:
    """Once a checkpoint >= `step` is committed, SIGKILL rank 1 and its checkpoint helpers.

    torchrun starts each rank in its own session, so the rank's process group holds the rank
    and the processes it started (megatron's writer Manager), as a crashed host would lose them.
    """
    deadline = time.monotonic() + timeout_s
    while (store.read_latest(run_dir / "checkpoints") or 0) < step:
        assert time.monotonic() < deadline and proc.poll() is None, "run ended early"
        time.sleep(0.05)
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("LOCAL_RANK") == "1" and "llmctl.train.entry" in " ".join(
                child.cmdline()
            ):
                os.killpg(child.pid, signal.SIGKILL)
                return
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("rank 1 not found")


@pytest.mark.multiproc
@pytest.mark.slow
def test_tp1_checkpoint_resumes_as_tp2(corpus: Path, tmp_path: Path) -> None:
    common = [*base_overrides(corpus, ITERS), "checkpoint.interval=2", "checkpoint.keep_last=10"]
    from llmctl.train import run_in_process

    tp1 = write_run(tmp_path / "tp1", [*common, "parallel.tp=1"])
    run_in_process(load_resolved(tp1 / "config.yaml"), tp1)  # one rank: in this process
    reference = losses(tp1)
    assert sorted(reference) == list(range(1, ITERS + 1))

    tp2 = write_run(tmp_path / "tp2", [*common, "parallel.tp=2"])
    name = store.iter_name(4)
    shutil.copytree(tp1 / "checkpoints" / name, tp2 / "checkpoints" / name)
    proc = start_entry(tp2, nproc=2)
    assert _wait(proc) == 0, (tp2 / "process.log").read_text()[-3000:]
    log = (tp2 / "logs" / "rank0.log").read_text()
    assert "resumed from iter_0000004" in log and "resharded tp" in log
    got = losses(tp2)
    assert sorted(got) == list(range(5, ITERS + 1))
    for step in got:
        assert got[step] == pytest.approx(reference[step], abs=1e-5), step
    assert store.read_latest(tp2 / "checkpoints") == ITERS
    assert all(v.ok for v in store.list_checkpoints(tp2 / "checkpoints", full=True))


@pytest.mark.multiproc
@pytest.mark.slow
def test_torchrun_restarts_group_after_rank_kill_and_resumes(corpus: Path, tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "dp2",
        [*base_overrides(corpus, KILL_ITERS), "parallel.dp=2", "checkpoint.interval=1"],
    )
    # Without it, torch 2.13's restarted gloo ranks can read the dead attempt's peer addresses
    # from torchrun's shared store ("connectFullMesh failed ... Connection refused").
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    proc = start_entry(run, nproc=2, extra=["--max-restarts=1"], env=env)
    try:
        _kill_one_rank_after(run, proc, 3)
    except BaseException:
        kill_tree(proc)
        raise
    assert _wait(proc) == 0, (run / "process.log").read_text()[-3000:]
    log = (run / "logs" / "rank0.log").read_text()
    resumed = [int(s) for s in re.findall(r"resumed from iter_(\d+)", log)]
    assert len(resumed) == 1 and resumed[0] >= 3  # restarted by torchrun, resumed by itself
    assert max(losses(run)) == KILL_ITERS
    assert all(v.ok for v in store.list_checkpoints(run / "checkpoints", full=True))


@pytest.mark.multiproc
@pytest.mark.slow
def test_fsdp_checkpoint_resumes_bit_exact(corpus: Path, tmp_path: Path) -> None:
    """FSDP (DP=2): a run saves every 2 steps; a second run directory gets its step-4
    checkpoint (each rank's parameter and Adam shards) and trains to step 8 with the losses of
    the first, bit for bit; so does a third at DP=1 (a resharded resume)."""
    common = [
        *base_overrides(corpus, ITERS),
        "parallel.optimizer_sharding=full",
        "checkpoint.interval=2",
        "checkpoint.keep_last=10",
    ]
    first = write_run(tmp_path / "first", [*common, "parallel.dp=2"])
    proc = start_entry(first, nproc=2)
    assert _wait(proc) == 0, (first / "process.log").read_text()[-3000:]
    reference = losses(first)
    assert sorted(reference) == list(range(1, ITERS + 1))
    assert all(v.ok for v in store.list_checkpoints(first / "checkpoints", full=True))

    second = write_run(tmp_path / "second", [*common, "parallel.dp=2"])
    name = store.iter_name(4)
    shutil.copytree(first / "checkpoints" / name, second / "checkpoints" / name)
    proc = start_entry(second, nproc=2)
    assert _wait(proc) == 0, (second / "process.log").read_text()[-3000:]
    assert "resumed from iter_0000004" in (second / "logs" / "rank0.log").read_text()
    got = losses(second)
    assert sorted(got) == list(range(5, ITERS + 1))
    assert {s: got[s] for s in got} == {s: reference[s] for s in got}

    # Resharded to DP=1: each rank's slice of SwiGLU's fused fc1 (and of its Adam moments) is
    # checkpointed as rows of the whole [gate; up] matrix, so one process reads the two shards
    # back as the matrix and trains on bit for bit (megatron's own halves were 8e-3 off).
    third = write_run(tmp_path / "third", [*common, "parallel.dp=1"])
    shutil.copytree(first / "checkpoints" / name, third / "checkpoints" / name)
    proc = start_entry(third, nproc=1)
    assert _wait(proc) == 0, (third / "process.log").read_text()[-3000:]
    got = losses(third)
    assert sorted(got) == list(range(5, ITERS + 1))
    assert got == {s: reference[s] for s in got}


@pytest.mark.multiproc
@pytest.mark.slow
def test_fsdp_checkpoint_with_uneven_shards_is_refused_at_start(
    corpus: Path, tmp_path: Path
) -> None:
    """DP=3 does not divide the 4,096-row embedding: FSDP2's shards are unequal, which
    megatron-core's checkpoint cannot describe (a save failed, then the ranks hung). Refused
    in one line before the first step; nothing is written under checkpoints/."""
    run = write_run(
        tmp_path / "dp3",
        [
            *base_overrides(corpus, 4),
            "parallel.dp=3",
            "parallel.optimizer_sharding=full",
            "train.global_batch_size=12",
            "parallel.micro_batch_size=4",
            "checkpoint.interval=2",
        ],
    )
    proc = start_entry(run, nproc=3)
    assert _wait(proc) != 0
    log = (run / "process.log").read_text()
    assert "FSDP cannot checkpoint embedding.word_embeddings.weight (4096 rows) over DP=3" in log
    assert not losses(run)
    assert store.committed_steps(run / "checkpoints") == []
