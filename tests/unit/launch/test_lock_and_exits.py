"""The run-directory lock against real processes (the kernel's flock), and rank exit reports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.launch.common import RankExits
from llmctl.run.lock import acquire_run_lock, check_run_lock, hold_for_rank

REPO = Path(__file__).resolve().parents[3]
_HOLDER = """
import sys, time
from pathlib import Path
from llmctl.run.lock import acquire_run_lock, hold_for_rank
kind, run_dir = sys.argv[1], Path(sys.argv[2])
held = acquire_run_lock(run_dir) if kind == "launcher" else hold_for_rank(run_dir, 0)
print("held", flush=True)
time.sleep(600)
"""


def _holder(kind: str, run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LLMCTL_RUN_LOCK_HELD", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, kind, str(run_dir)], env=env, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
    return proc


@pytest.mark.parametrize("kind", ["launcher", "rank0"])
def test_a_live_holder_refuses_others_and_a_killed_one_releases(kind: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # written by the launcher before any rank starts
    proc = _holder(kind, run_dir)
    try:
        for attempt in (lambda: acquire_run_lock(run_dir), lambda: check_run_lock(run_dir)):
            with pytest.raises(UserError) as refused:
                attempt()
            msg = refused.value.message
            assert f"pid {proc.pid} on host {socket.gethostname()}" in msg and "\n" not in msg
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: no cleanup code runs
        proc.wait()
    acquire_run_lock(run_dir).release()  # the kernel dropped the lock with the process


def test_ranks_of_a_run_share_the_ranks_lock(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LLMCTL_RUN_LOCK_HELD", "1")  # as under llmctl's local launcher
    first = hold_for_rank(tmp_path, 1)
    second = hold_for_rank(tmp_path, 2)  # other ranks of the same run: no conflict
    with pytest.raises(UserError, match="training processes"):
        acquire_run_lock(tmp_path)  # but no launcher may start another trainer there
    for lock in first + second:
        lock.release()
    acquire_run_lock(tmp_path).release()


def test_check_writes_nothing_into_a_run_dir(tmp_path: Path) -> None:
    check_run_lock(tmp_path)
    check_run_lock(tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []


def test_rank_exit_codes_are_read_across_chunks_and_streams() -> None:
    exits = RankExits()
    exits.feed(b"step=3 loss=1.0\nllmctl: rank 1 exi", source=1)
    exits.feed(b"noise from another node\n", source=2)
    exits.feed(b"ts 3: stopping: 2 consecutive checkpoint saves failed\n", source=1)
    assert exits.exit_code(1) == 3 and exits.exit_code(0) == 0
    assert exits.reason() == "stopping: 2 consecutive checkpoint saves failed"
    assert RankExits().exit_code(1) == 1  # nothing reported: torchrun's own code
    started = time.monotonic()
    big = RankExits()
    big.feed(b"x" * 1_000_000)  # a huge line without newline stays bounded
    assert time.monotonic() - started < 1 and big.exit_code(7) == 7
