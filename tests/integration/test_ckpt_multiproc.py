"""Multi-process checkpoints: TP1 -> TP2 resharding on resume, and torchrun restarts after kill -9.

One TP=1 run (one process) trains 8 steps with checkpoints every 2. A second run directory gets
its step-4 checkpoint and is trained to step 8 with TP=2 under torchrun with `--max-restarts=1`;
after it has committed a TP=2 checkpoint, one rank is killed with SIGKILL. torchrun brings the
group back, the ranks resume from the newest complete checkpoint by themselves, and the run
finishes. Losses after resharding match the TP=1 run to 1e-5 (TP=2 splits the GEMMs and the
reductions, so bits differ in the last places; measured agreement is ~1e-7).
"""

from __future__ import annotations

import re
import shutil
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

from llmctl.train import ckpt_store as store  # noqa: E402

ITERS = 8


def _wait(proc, timeout_s: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except Exception:
        kill_tree(proc)
        raise


def _kill_one_rank_after(run_dir: Path, proc, step: int, timeout_s: float = 120) -> None:
    """Once a checkpoint >= `step` is committed, SIGKILL the worker with LOCAL_RANK=1."""
    deadline = time.monotonic() + timeout_s
    while (store.read_latest(run_dir / "checkpoints") or 0) < step:
        assert time.monotonic() < deadline and proc.poll() is None, "run ended early"
        time.sleep(0.05)
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("LOCAL_RANK") == "1" and "llmctl.train.entry" in " ".join(
                child.cmdline()
            ):
                child.kill()
                return
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("rank 1 not found")


@pytest.mark.multiproc
@pytest.mark.slow
def test_tp1_checkpoint_resumes_as_tp2_and_survives_rank_kill(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "data" / "corpus")
    common = [*base_overrides(corpus, ITERS), "checkpoint.interval=2", "checkpoint.keep_last=10"]
    tp1 = write_run(tmp_path / "tp1", [*common, "parallel.tp=1"])
    assert _wait(start_entry(tp1)) == 0
    reference = losses(tp1)
    assert sorted(reference) == list(range(1, ITERS + 1))

    tp2 = write_run(tmp_path / "tp2", [*common, "parallel.tp=2", "checkpoint.interval=1"])
    name = store.iter_name(4)
    shutil.copytree(tp1 / "checkpoints" / name, tp2 / "checkpoints" / name)
    proc = start_entry(tp2, nproc=2, extra=["--max-restarts=1"])
    try:
        _kill_one_rank_after(tp2, proc, 6)
    except BaseException:
        kill_tree(proc)
        raise
    assert _wait(proc) == 0, (tp2 / "process.log").read_text()[-3000:]

    log = (tp2 / "logs" / "rank0.log").read_text()
    resumed = [int(s) for s in re.findall(r"resumed from iter_(\d+)", log)]
    assert resumed[0] == 4 and "resharded tp" in log
    assert len(resumed) == 2 and resumed[1] >= 6  # the restart found the TP=2 checkpoint
    got = losses(tp2)
    assert sorted(got) == list(range(5, ITERS + 1))
    for step in got:
        assert got[step] == pytest.approx(reference[step], abs=1e-5), step
    assert store.read_latest(tp2 / "checkpoints") == ITERS
