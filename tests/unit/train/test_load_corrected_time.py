"""The load-corrected step time (`metrics.cpu_share`) against the kernel's own per-thread CPU
clock: a loop sharing one CPU with a busy process (both pinned to the same CPU, so the
contention does not depend on the host's speed or load) takes longer in wall time, and
wall * share is its CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from llmctl.run.metrics import cpu_share, rank_times, sched_ns

pytestmark = pytest.mark.skipif(
    sched_ns() is None or not hasattr(os, "sched_setaffinity"), reason="no Linux schedstat"
)


def test_wall_times_share_is_the_threads_cpu_time() -> None:
    cpu = min(os.sched_getaffinity(0))
    before_mask = os.sched_getaffinity(0)
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}}); print('on', flush=True)\nwhile 1: pass"
    hog = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None and hog.stdout.readline() == "on\n"  # spinning from now
        os.sched_setaffinity(0, {cpu})
        t0, c0, s0 = time.perf_counter(), time.thread_time(), sched_ns()
        x = 0
        for i in range(3_000_000):
            x += i
        wall, used = time.perf_counter() - t0, time.thread_time() - c0
        mine = rank_times(wall, s0, sched_ns())
    finally:
        os.sched_setaffinity(0, before_mask)
        hog.kill()
        hog.wait()
    assert mine is not None
    share = cpu_share(wall, [mine])
    assert share is not None and share < 0.8  # it did wait for the CPU
    assert wall * share == pytest.approx(used, rel=0.1)
