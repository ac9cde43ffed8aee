"""The node wrapper (`python -m llmctl.launch.node`) against real child processes.

It must exit with the code a rank reported (torchrun itself exits 1), pass a child's death by
signal on as the same signal, stop its child when standard input closes (`--watch-stdin`, the
ssh launcher's session ending) and end what the child left behind, and record a SLURM job's
exit code in launch.json.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

NODE = [sys.executable, "-m", "llmctl.launch.node"]


def test_exits_with_the_reported_rank_code_not_the_launchers() -> None:
    child = "import sys; print('llmctl: rank 0 exits 3: stopping: x', file=sys.stderr); sys.exit(1)"
    out = subprocess.run([*NODE, "run", "--", sys.executable, "-c", child],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 3, out
    assert "llmctl: rank 0 exits 3: stopping: x" in out.stdout  # passed through


def test_a_child_killed_by_a_signal_is_passed_on_as_that_signal() -> None:
    out = subprocess.run([*NODE, "run", "--", "sh", "-c", "kill -9 $$"], timeout=60)
    assert out.returncode == -signal.SIGKILL


def test_closed_stdin_stops_the_child_and_its_leftovers(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The child starts a grandchild in its own session (as torchrun starts ranks), then waits.
    child = (
        "import os, subprocess, sys, time; "
        "g = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        f"open({str(pids)!r}, 'w').write(str(g.pid)); time.sleep(300)"
    )
    proc = subprocess.Popen([*NODE, "run", "--watch-stdin", "--", sys.executable, "-c", child],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    grandchild = int(pids.read_text())
    assert proc.stdin is not None
    proc.stdin.close()  # what the launcher does to stop a node, or its dying ssh client
    rc = proc.wait(timeout=60)
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert rc == -signal.SIGTERM, (rc, out)
    assert "ssh session closed; stopping this node" in out
    assert not Path(f"/proc/{grandchild}").exists() or _zombie(grandchild)  # swept by run token


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_record_adds_the_exit_code_to_launch_json(tmp_path: Path) -> None:
    (tmp_path / "launch.json").write_text(json.dumps({"kind": "slurm", "job_id": "7"}) + "  ")
    subprocess.run([*NODE, "record", str(tmp_path), "3"], check=True, timeout=60)
    record = json.loads((tmp_path / "launch.json").read_text())
    assert record["exit_code"] == 3 and record["job_id"] == "7"
