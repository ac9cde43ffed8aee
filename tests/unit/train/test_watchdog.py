"""The hang watchdog in a real child process: an untimed span passes, a stall ends it with 75.

No torch here: the watchdog thread, its heartbeat, its stack dump and its exit are exercised
on a plain Python process whose "training loop" stops beating.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from llmctl.run.health import EXIT_HANG, read_events

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from llmctl.config import compose
    from llmctl.train.watchdog import start_watchdog

    run_dir = Path(sys.argv[1])
    (run_dir / "logs").mkdir(parents=True)
    cfg = compose("tiny_cpu", ["train.health.hang_floor_s=1", "train.eval_interval=0"])
    wd = start_watchdog(cfg, run_dir, 0, 1, None)
    for step in range(1, 6):
        time.sleep(0.05)
        wd.beat(step, 1.0, 0.05)
    with wd.untimed():  # e.g. a rollback's reload: longer than the timeout, not a hang
        time.sleep(3.0)
    print("untimed span passed", flush=True)
    wd.beat(6, 1.0, 0.05)
    def stuck_in_the_loop():
        time.sleep(60)  # the stall: no more beats
    stuck_in_the_loop()
    print("not reached", flush=True)
    """
)


def test_a_stall_dumps_the_stack_and_exits_75_but_an_untimed_span_does_not(tmp_path: Path):
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir)], capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == EXIT_HANG, proc.stderr[-2000:]
    assert "untimed span passed" in proc.stdout and "not reached" not in proc.stdout
    (event,) = read_events(run_dir)
    assert event["event"] == "hang" and event["step"] == 6 and event["timeout_s"] == 1.0
    assert 1.0 <= event["waited_s"] < 3.0, event
    line = f"rank 0 on {socket.gethostname()} made no progress for"
    assert f"llmctl: rank 0 exits {EXIT_HANG}: {line}" in proc.stderr, proc.stderr[-2000:]
    dump = (Path(event["stacks"]) / "rank0.txt").read_text()
    assert "no progress for" in dump and "in stuck_in_the_loop" in dump, dump
    assert elapsed < 20
