"""Inside a real SLURM job (local cluster of scripts/slurm_local.sh): `llmctl topo` sees the job."""

import json
import shutil
import socket
import subprocess
import sys

import pytest


def _slurm_up() -> bool:
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        return False
    try:
        # 30 s: a busy controller on a loaded host can take seconds, and a timeout here
        # would silently skip the test rather than fail it.
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(not _slurm_up(), reason="no SLURM controller answering"),
]


def test_topo_inside_srun_reports_the_job() -> None:
    cmd = ["srun", "-N1", "-n1", "-t", "1", sys.executable, "-m", "llmctl", "topo", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)
    data = json.loads(out.stdout)
    assert data["slurm"]["job_id"].isdigit() and data["num_nodes"] == 1
    assert data["slurm"]["nodes"] == [socket.gethostname().split(".")[0]]
    assert data["cpu"]["num_logical"] >= 1
