"""Preemption, run-directory lock and process cleanup through the real local launcher.

A real `llmctl train` process (launcher=local: torchrun, ranks in their own sessions, megatron's
async writer Manager) is driven the way users and schedulers do: SIGTERM to the launcher, kill -9
of one rank under `launcher.max_restarts`, kill -9 of the launcher's whole process group. After
each, the oracle is the operating system (/proc: no process carrying the run's marker is left)
and the run directory (which checkpoint exists, which steps metrics.jsonl holds).
"""

from __future__ import annotations

import os
import signal
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

from llmctl.launch.jobs import run_status  # noqa: E402
from llmctl.run import ckpt_store as store  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared indexed dataset of this module."""
    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


def _train_args(run_dir: Path, corpus: Path, iters: int, *extra: str) -> list[str]:
    return ["train", "recipe=tiny_cpu", "launcher=local", f"train.run_dir={run_dir}",
            *base_overrides(corpus, iters), *extra]  # fmt: skip


def _wait_rc(proc, timeout_s: float, mark: str) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except Exception:
        kill_marked(mark)
        raise AssertionError(f"llmctl did not return within {timeout_s:.0f} s") from None


def test_sigterm_to_launcher_saves_the_current_step_and_resume_redoes_none(
    corpus: Path, tmp_path: Path
) -> None:
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    proc = start_cli(_train_args(run_dir, corpus, 400, "checkpoint.interval=5"), mark, log)
    try:
        wait_until(lambda: len(losses(run_dir)) >= 7, 180, "7 steps")
        # A second trainer on the same run directory is refused in one line naming the holder.
        second = start_cli(["resume", str(run_dir)], mark + "x", tmp_path / "second.log")
        assert _wait_rc(second, 120, mark + "x") == 2
        refusal = (tmp_path / "second.log").read_text().strip().splitlines()
        assert len(refusal) == 1, refusal
        assert f"pid {proc.pid} on host" in refusal[0] and "in use" in refusal[0], refusal
        at_signal = max(losses(run_dir))
        os.kill(proc.pid, signal.SIGTERM)  # what a scheduler or a user's `kill` sends
        rc = _wait_rc(proc, 120, mark)
        assert_no_process_left(mark, 10)  # before the cleanup below kills what is left
    finally:
        kill_marked(mark)
    out = log.read_text()
    assert rc == 143, out[-3000:]  # the rank's 128+SIGTERM reaches the user, not torchrun's 1
    assert launch_record(run_dir)["exit_code"] == 143
    saved = store.read_latest(run_dir / "checkpoints")
    last = max(losses(run_dir))
    # The checkpoint of the step the signal arrived in: the last step trained, as the rank
    # itself reports it. Not `at_signal + 1` at most: the signal crosses three processes
    # (llmctl, torchrun, the rank), which on a fast or a loaded host can take longer than a
    # ~20-40 ms step, so the rank may be a step or two further on when it arrives.
    assert saved == last and saved >= at_signal, (saved, last, at_signal)
    rank_log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"preempted by SIGTERM at step {saved}; newest checkpoint is step {saved}" in rank_log
    assert all(v.ok for v in store.list_checkpoints(run_dir / "checkpoints", full=True))
    assert run_status(str(run_dir)).state == "FAILED"  # exit code recorded: not RUNNING

    mark2 = new_mark()
    again = start_cli(["resume", str(run_dir), f"train.train_iters={saved + 2}"], mark2, log)
    assert _wait_rc(again, 240, mark2) == 0, log.read_text()[-3000:]
    assert_no_process_left(mark2, 10)
    steps = metric_steps(run_dir)
    assert steps == list(range(1, saved + 3)), steps  # every step exactly once: none redone
    assert f"resumed from {store.iter_name(saved)}" in (run_dir / "logs" / "rank0.log").read_text()
    assert run_status(str(run_dir)).state == "COMPLETED"


def _kill_rank(mark: str, local_rank: str) -> None:
    """SIGKILL one rank process alone (its Manager and writers are left to fend for themselves)."""
    for pid in marked_pids(mark):
        try:
            p = psutil.Process(pid)
            if "llmctl.train.entry" in " ".join(p.cmdline()) and (
                p.environ().get("LOCAL_RANK") == local_rank
            ):
                os.kill(pid, signal.SIGKILL)
                return
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"rank {local_rank} not found")


def test_rank_crash_with_in_job_restart_returns_and_leaves_nothing(
    corpus: Path, tmp_path: Path
) -> None:
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    # 30 steps: 26 left after the kill at 4, so a fast host is still training when it lands.
    args = _train_args(run_dir, corpus, 30, "parallel.dp=2", "checkpoint.interval=2",
                       "launcher.max_restarts=1")  # fmt: skip
    proc = start_cli(args, mark, log)
    try:
        wait_until(lambda: (store.read_latest(run_dir / "checkpoints") or 0) >= 4, 240, "iter 4")
        # Rank 0: its async saves run megatron's checkpoint Manager (rank 1 writes nothing of
        # this tiny model, so it starts none and would leave nothing behind).
        _kill_rank(mark, "0")
        rc = _wait_rc(proc, 300, mark)  # before the fix: never returned (orphans held the pipe)
        # Without the fix the killed rank's Manager (SIGTERM blocked) outlives it.
        assert_no_process_left(mark, 10)  # before the cleanup below kills what is left
    finally:
        kill_marked(mark)
    assert rc == 0, log.read_text()[-3000:]
    assert launch_record(run_dir)["exit_code"] == 0
    assert run_status(str(run_dir)).state == "COMPLETED"
    assert max(losses(run_dir)) == 30


def test_killed_launcher_takes_its_ranks_with_it(corpus: Path, tmp_path: Path) -> None:
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    # The interval is past the last step, so the only checkpoint before the end is the stop's
    # own save, however late the cancel lands on a loaded machine.
    proc = start_cli(_train_args(run_dir, corpus, 1500, "checkpoint.interval=100000"), mark, log)
    try:
        wait_until(lambda: len(losses(run_dir)) >= 3, 180, "3 steps")
        os.killpg(proc.pid, signal.SIGKILL)  # llmctl and torchrun; the ranks have own sessions
        proc.wait(timeout=30)
        t0 = time.monotonic()
        assert_no_process_left(mark, 60)  # the ranks checkpoint on SIGTERM, then exit
        ended_s = time.monotonic() - t0
    finally:
        kill_marked(mark)
    stopped_at = max(losses(run_dir))
    assert store.read_latest(run_dir / "checkpoints") == stopped_at, ended_s
    assert run_status(str(run_dir)).state == "EXITED"  # no exit code, and nothing runs


def test_llmctl_cancel_stops_a_local_run_with_a_checkpoint(corpus: Path, tmp_path: Path) -> None:
    """`llmctl cancel RUN`: the launcher's ranks save the current step and the run ends 143;
    a second cancel says there is nothing to stop."""
    import subprocess
    import sys

    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    # The interval is past the last step, so the only checkpoint before the end is the stop's
    # own save, however late the cancel lands on a loaded machine.
    proc = start_cli(_train_args(run_dir, corpus, 1500, "checkpoint.interval=100000"), mark, log)
    cli = [sys.executable, "-m", "llmctl", "cancel", str(run_dir)]
    try:
        wait_until(lambda: len(losses(run_dir)) >= 3, 180, "3 steps")
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "stop requested (was RUNNING)" in " ".join(out.stdout.split()), out.stdout
        rc = _wait_rc(proc, 120, mark)
        assert_no_process_left(mark, 10)
    finally:
        kill_marked(mark)
    assert rc == 143, log.read_text()[-3000:]
    saved = store.read_latest(run_dir / "checkpoints")
    assert saved == max(losses(run_dir)) and saved < 1500  # the stop's own save, not the end's
    again = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "is not running (FAILED (exit code 143)); nothing to stop" in " ".join(
        again.stdout.split()
    ), again.stdout
