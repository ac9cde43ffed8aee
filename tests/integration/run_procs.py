"""Helpers of the launcher-level reliability tests: a real `llmctl` process and its descendants.

Each test marks the `llmctl` process it starts with a unique environment variable; every
process of the run inherits it (torchrun, ranks in their own sessions, megatron's Manager,
forked writers, the resource tracker), so scanning /proc for it finds every process the run
left behind, whatever its session or parent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ckpt_support import child_env

MARK_ENV = "LLMCTL_TEST_MARK"


def start_cli(args: list[str], mark: str, log: Path) -> subprocess.Popen:
    """Start `llmctl ARGS` as a real process (its own process group) with the marker set."""
    argv = [sys.executable, "-c", "from llmctl.cli.main import main; main()", *args]
    out = open(log, "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        argv,
        env={**child_env(), MARK_ENV: mark},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def new_mark() -> str:
    """A fresh marker value."""
    return uuid.uuid4().hex


def marked_pids(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries the marker."""
    needle = f"{MARK_ENV}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            pids.append(int(entry.name))
    return pids


def describe(pids: list[int]) -> str:
    """`pid: cmdline` lines, for assertion messages."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd[:160]}")
    return "\n".join(out)


def wait_until(cond, timeout_s: float, what: str) -> None:
    """Poll `cond` every 0.1 s; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def assert_no_process_left(mark: str, timeout_s: float = 30.0) -> None:
    """Every process of the run ends within `timeout_s`; else list them, kill them, fail."""
    try:
        wait_until(lambda: not marked_pids(mark), timeout_s, "the run's processes to end")
    except AssertionError:
        left = marked_pids(mark)
        text = describe(left)
        kill_marked(mark)
        raise AssertionError(f"processes of the run left behind:\n{text}") from None


def kill_marked(mark: str) -> None:
    """SIGKILL every marked process (test cleanup)."""
    for pid in marked_pids(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def launch_record(run_dir: Path) -> dict:
    """RUN_DIR/launch.json."""
    return json.loads((run_dir / "launch.json").read_text())


def metric_steps(run_dir: Path) -> list[int]:
    """Every step line of metrics.jsonl in order (a redone step appears twice)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [int(json.loads(line)["step"]) for line in lines if line.strip()]
