"""The pod's PID 1: `python -m llmctl.launch.node run --forward-signals -- ARGV`.

The kubelet signals PID 1 only. The wrapper must hand SIGTERM to the ranks (the children of
ARGV, torchrun's workers) rather than to torchrun, which would kill them 30 s later whatever
their checkpoint needs. Real processes: a stand-in agent that starts one "rank" and reports
which of them saw the signal.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

RANK = textwrap.dedent("""
    import signal, sys, time
    def stop(signum, frame):
        print("rank got SIGTERM", flush=True)
        print("llmctl: rank 0 exits 143: preempted", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("rank ready", flush=True)
    time.sleep(60)
""")
AGENT = textwrap.dedent("""
    import signal, subprocess, sys
    signal.signal(signal.SIGTERM, lambda s, f: print("agent got SIGTERM", flush=True))
    rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
    while True:
        try:
            rank.wait()
            break
        except InterruptedError:
            continue
    sys.exit(1)  # torchrun: 1 whatever its worker's code
""")


def test_sigterm_goes_to_the_ranks_and_their_code_is_the_pods(tmp_path: Path) -> None:
    log = tmp_path / "pod.log"
    argv = [sys.executable, "-m", "llmctl.launch.node", "run", "--forward-signals", "--",
            sys.executable, "-c", AGENT, RANK]  # fmt: skip
    with log.open("wb") as out:
        pod = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "rank ready" not in log.read_text():
            assert time.monotonic() < deadline and pod.poll() is None, log.read_text()
            time.sleep(0.05)
        pod.send_signal(signal.SIGTERM)  # what the kubelet does
        code = pod.wait(timeout=60)
    text = log.read_text()
    assert "rank got SIGTERM" in text and "agent got SIGTERM" not in text, text
    assert code == 143, text  # the rank's reported code, not the agent's 1
