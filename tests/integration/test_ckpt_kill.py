"""kill -9 of the whole run while async saves are in flight, repeated at random moments.

Every restart must find a valid checkpoint and resume from it, and no committed checkpoint
directory may ever fail full validation (sizes, CRC32s, shards named by `.metadata`).
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from ckpt_support import base_overrides, make_corpus, start_entry, write_run
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.run import ckpt_store as store

NUM_KILLS = int(os.environ.get("LLMCTL_TEST_KILLS", "4"))
ITERS = 400


def _wait_for_new_commit(root: Path, after: int | None, proc, timeout_s: float = 90) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        latest = store.read_latest(root)
        if latest is not None and latest >= (after or 0) + 3:  # past the slow first save
            return latest
        assert proc.poll() is None, "training exited before it was killed"
        time.sleep(0.02)
    raise AssertionError("no new checkpoint committed in time")


def _resumed_steps(run_dir: Path) -> list[int]:
    text = (run_dir / "logs" / "rank0.log").read_text()
    return [int(m) for m in re.findall(r"resumed from iter_(\d+)", text)]


@pytest.mark.slow
def test_kill9_during_async_saves(tmp_path: Path) -> None:
    seed = int(os.environ.get("LLMCTL_TEST_SEED", str(time.time_ns() % 10_000)))
    rng = random.Random(seed)
    corpus = make_corpus(tmp_path / "data" / "corpus")
    run_dir = write_run(
        tmp_path / "run",
        [*base_overrides(corpus, ITERS), "checkpoint.interval=1", "checkpoint.keep_last=2"],
    )
    root = run_dir / "checkpoints"
    newest_before_kill: list[int] = []
    for attempt in range(NUM_KILLS):
        proc = start_entry(run_dir)
        prev = newest_before_kill[-1] if newest_before_kill else None
        _wait_for_new_commit(root, prev, proc)
        time.sleep(rng.uniform(0.0, 0.3))  # a save is in flight almost all the time (interval 1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        checkpoints = store.list_checkpoints(root, full=True)
        assert checkpoints, f"seed {seed}, kill {attempt}: no checkpoint left"
        for v in checkpoints:
            assert v.ok, f"seed {seed}, kill {attempt}: {v.path.name} invalid: {v.problems}"
        newest_before_kill.append(checkpoints[0].step)  # type: ignore[arg-type]
        resumed = _resumed_steps(run_dir)
        if attempt > 0:  # the restart resumed from the newest checkpoint of the previous kill
            assert resumed[-1] == newest_before_kill[-2], f"seed {seed}: {resumed}"
    assert len(_resumed_steps(run_dir)) == NUM_KILLS - 1
    assert all(v.ok for v in store.list_checkpoints(root, full=True))
    # Finish through the CLI (`llmctl resume` -> the local launcher -> torchrun): it cleans the
    # last kill's leftovers, resumes from the newest checkpoint and trains two more steps.
    target = newest_before_kill[-1] + 2
    res = CliRunner().invoke(app, ["resume", str(run_dir), f"train.train_iters={target}", "--json"])
    assert res.exit_code == 0, res.output
    assert _resumed_steps(run_dir)[-1] == newest_before_kill[-1]
    assert store.read_latest(root) == target
    log = (run_dir / "logs" / "rank0.log").read_text()
    interrupted = log.count("removed leftovers of interrupted saves")
    assert interrupted >= 1, f"seed {seed}: no kill hit a save in flight"
