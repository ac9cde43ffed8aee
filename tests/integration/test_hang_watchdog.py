"""Hang watchdog through the real local launcher: SIGSTOP one rank of a DP2 torchrun run.

A stopped rank cannot run code, so the other rank waits in its next gloo collective; the
watchdogs must notice within the stated timeout, leave every rank's Python stacks under
RUN_DIR/hangs/, end the job with the hang exit code (75) and one line naming the stopped rank,
and `llmctl resume` must continue from the newest committed checkpoint to the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
psutil = pytest.importorskip("psutil")

from ckpt_support import base_overrides, losses, make_corpus  # noqa: E402
from run_procs import (  # noqa: E402
    assert_no_process_left,
    kill_marked,
    launch_record,
    marked_pids,
    metric_steps,
    new_mark,
    start_cli,
    wait_until,
)

from llmctl.run import ckpt_store as store  # noqa: E402
from llmctl.run.health import EXIT_HANG, read_events  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

FLOOR_S = 10.0  # train.health.hang_floor_s: the timeout (K x 0.1-0.5 s steps is below it)
ITERS = 24


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared indexed dataset of this module."""
    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


def _rank_pid(mark: str, local_rank: str) -> int:
    """The rank process itself (a child of torchrun), not a checkpoint writer forked from it."""
    for pid in marked_pids(mark):
        try:
            p = psutil.Process(pid)
            if (
                "llmctl.train.entry" in " ".join(p.cmdline())
                and p.environ().get("LOCAL_RANK") == local_rank
                and "torch.distributed.run" in " ".join(p.parent().cmdline())
            ):
                return pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"rank {local_rank} not found")


def test_sigstop_of_one_rank_dumps_stacks_exits_75_and_resume_finishes(
    corpus: Path, tmp_path: Path
) -> None:
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    args = ["train", "recipe=tiny_cpu", "launcher=local", f"train.run_dir={run_dir}",
            *base_overrides(corpus, ITERS), "parallel.dp=2", "checkpoint.interval=3",
            f"train.health.hang_floor_s={FLOOR_S}"]  # fmt: skip
    proc = start_cli(args, mark, log)
    try:
        wait_until(lambda: (store.read_latest(run_dir / "checkpoints") or 0) >= 3, 240, "iter 3")
        victim = _rank_pid(mark, "1")
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.time()
        rc = proc.wait(timeout=120)
        returned_s = time.time() - stopped_at
        assert_no_process_left(mark, 30)  # the stopped rank too (torchrun kills it)
    finally:
        kill_marked(mark)
    out = log.read_text()
    assert rc == EXIT_HANG, out[-3000:]
    events = [e for e in read_events(run_dir) if e["event"] == "hang"]
    assert events, out[-3000:]
    first = min(events, key=lambda e: e["detected_unix"])
    detected_s = first["detected_unix"] - stopped_at
    # never before the timeout since the last progress; and after the SIGSTOP within the
    # timeout plus one heartbeat interval of polling (1 s) and a loaded host's slack
    assert first["waited_s"] >= FLOOR_S and first["timeout_s"] == FLOOR_S, first
    assert detected_s < FLOOR_S + 5.0, (detected_s, first)
    host = socket.gethostname()
    assert [(b["rank"], b["host"]) for b in first["blamed"]] == [(1, host)], first
    line = f"rank 1 on {host} made no progress for"
    assert line in out and "stacks in " + str(run_dir / "hangs") in out, out[-3000:]
    assert launch_record(run_dir)["exit_code"] == EXIT_HANG
    assert launch_record(run_dir)["reason"].startswith(line)
    # one line for the user: `run failed (exit 75): rank 1 on HOST made no progress ...`
    assert f"run failed (exit {EXIT_HANG}): {line}" in out

    stacks = Path(first["stacks"])
    assert stacks.parent == run_dir / "hangs"
    mine, victims = (stacks / "rank0.txt").read_text(), (stacks / "rank1.txt").read_text()
    # rank 0 waits in a collective of the training loop: its main thread is in the loop
    assert "Current thread" in mine or "Thread 0x" in mine, mine
    assert "llmctl/train/" in mine and "_train_loop" in mine, mine
    # rank 1 was stopped: it says so, and (after SIGCONT) shows where it was
    assert "state at detection: T (stopped)" in victims, victims
    assert "_train_loop" in victims, victims
    print(f"\nhang detected {detected_s:.1f} s after SIGSTOP (timeout {first['timeout_s']} s, "
          f"no progress for {first['waited_s']} s); llmctl returned {returned_s:.1f} s after "
          "SIGSTOP")  # fmt: skip

    newest = store.read_latest(run_dir / "checkpoints")
    assert newest is not None and newest >= 3
    mark2 = new_mark()
    again = start_cli(["resume", str(run_dir)], mark2, log)
    try:
        assert again.wait(timeout=300) == 0, log.read_text()[-3000:]
        assert_no_process_left(mark2, 30)
    finally:
        kill_marked(mark2)
    rank_log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"resumed from {store.iter_name(newest)}" in rank_log
    assert max(losses(run_dir)) == ITERS
    assert metric_steps(run_dir)[-(ITERS - newest) :] == list(range(newest + 1, ITERS + 1))
    assert json.loads((run_dir / "launch.json").read_text())["exit_code"] == 0
