"""Fixtures shared by the integration tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NETNS_SCRIPT = REPO / "scripts" / "netns_hosts.sh"
NETNS_DIR = Path(os.environ.get("LLMCTL_NETNS_DIR", "/tmp/llmctl-netns"))


@pytest.fixture(scope="session")
def two_hosts() -> Path:
    """Hosts h0 and h1 (network namespaces with sshd), left up for other tests and sessions;
    `scripts/netns_hosts.sh down` removes them."""
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces and per-host sshd")
    if shutil.which("ip") is None:
        pytest.skip("no iproute2 (ip) to make network namespaces")
    subprocess.run([NETNS_SCRIPT, "up", "2"], check=True, timeout=300)
    return NETNS_DIR


@pytest.fixture(scope="session")
def netns_slurm() -> Iterator[str]:
    """The three-node netns SLURM cluster of slurm_netns.py (up once, down at the session's
    end); yields its SLURM_CONF."""
    from slurm_netns import CONF, cluster

    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces and the SLURM daemons")
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        pytest.skip("no iproute2/nsenter to make the node namespaces")
    cluster("up")
    try:
        yield CONF
    finally:
        cluster("down", check=False)


@pytest.fixture(scope="session")
def toy_prefix(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small Megatron indexed dataset (.bin/.idx): runs of consecutive token ids."""
    import numpy as np

    from llmctl.data.indexed import ShardWriter

    prefix = tmp_path_factory.mktemp("data") / "toy"
    rng = np.random.default_rng(0)
    starts, lengths = rng.integers(0, 4000, 300), rng.integers(50, 200, 300)
    docs = [np.arange(s, s + n) % 4096 for s, n in zip(starts, lengths, strict=True)]
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(np.concatenate(docs), np.array([len(d) for d in docs]))
    writer.close()
    return str(prefix)
