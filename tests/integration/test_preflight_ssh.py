"""The ssh (hostfile) launcher's hardware preflight on real hosts: network namespaces with
sshd (scripts/netns_hosts.sh) and no GPU. A plan for an H100 cluster is refused in one line,
exit code 2, before the run directory or any process exists; the CPU cluster's ssh launch is
covered by test_multinode_train.py (no preflight for CPU clusters)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_gpu_plan_on_gpu_less_hosts_is_refused_before_start(
    two_hosts: Path, tmp_path: Path
) -> None:
    proc = subprocess.run([
        sys.executable, "-m", "llmctl", "train", "recipe=tiny_cpu", "cluster=dgx_h100",
        "cluster.gpus_per_node=1", "launcher=torchrun", "--nodes", "2", "--dp", "2",
        f"launcher.hostfile={two_hosts / 'hostfile'}",
        f"launcher.ssh_options=[-F,{two_hosts / 'ssh_config'}]", f"train.run_dir={tmp_path / 'r'}",
    ], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "hardware differs from the plan on h0: no NVIDIA GPU" in lines[0]
    assert "(and 1 more node(s))" in lines[0]
    assert not (tmp_path / "r").exists()
