"""The multi-node SLURM cluster of the integration tests: three netns nodes under one slurmctld.

h0, h1 and h2 are network namespaces, each with its own slurmd (scripts/slurm_local.sh,
LLMCTL_SLURM_NETNS=3), with `TopologyPlugin=topology/tree`: leaf switch leaf0 holds h0 and h1,
leaf1 holds h2. slurmctld sets a node that stops answering DOWN after 10 s
(LLMCTL_SLURMD_TIMEOUT), so a node crash fails (or requeues) its jobs within the test's time,
and job credentials live 10 s (LLMCTL_SLURM_CRED_EXPIRE), so SLURM holds a requeued job 11 s
instead of 121 s before it may start again.
The `netns_slurm` fixture (conftest.py) brings it up once per session. LLMCTL_TEST_SLURM_TAG
(a few letters) makes a second, separate cluster, for two test sessions side by side.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm_local.sh"
TAG = os.environ.get("LLMCTL_TEST_SLURM_TAG", "")
CLUSTER_DIR = "/tmp/llmctl-slurm-netns" + (f"-{TAG}" if TAG else "")
CONF = f"{CLUSTER_DIR}/etc/slurm.conf"
ENV = {
    "LLMCTL_SLURM_DIR": CLUSTER_DIR,
    "LLMCTL_SLURMCTLD_PORT": "6937" if TAG else "6917",
    "LLMCTL_SLURM_NETNS_TAG": TAG,
    "LLMCTL_SLURM_NETNS": "3",
    "LLMCTL_SLURM_TOPOLOGY": "leaf0=h[0-1] leaf1=h2",
    "LLMCTL_SLURM_SWITCH_WAIT": "6",
    "LLMCTL_SLURMD_TIMEOUT": "10",
    "LLMCTL_SLURM_CRED_EXPIRE": "10",
}


def cluster(*args: str, check: bool = True) -> None:
    """scripts/slurm_local.sh ARGS on this cluster (up, down, crash-node hK, restore-node hK)."""
    subprocess.run([SCRIPT, *args], env={**os.environ, **ENV}, check=check, timeout=300)


def scontrol(*args: str) -> str:
    """`scontrol ARGS` against this cluster; its standard output."""
    return subprocess.run(
        ["scontrol", *args], env={**os.environ, "SLURM_CONF": CONF},
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip


def job_field(job: str, name: str) -> str:
    """One `Name=value` field of `scontrol show job JOB` ('' when absent)."""
    for word in scontrol("show", "job", job).split():
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    return ""
