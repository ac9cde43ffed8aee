"""Bare-metal multi-node: `llmctl train launcher=torchrun` over ssh across two "hosts".

The hosts are network namespaces made by scripts/netns_hosts.sh, each with its own address,
hostname, hosts file and sshd; the launcher reads a hostfile, probes each host over ssh, and
starts one torchrun per host. The two-node run must reach the loss of a one-node run with the
same layout (DP=2), seed and data.

Tolerance: relative 1e-5. Both runs compute the same micro-batches on the same two DP ranks
and gloo's all-reduce of two operands is order-independent, so only the per-process thread
count differs (OMP_NUM_THREADS=1 with two ranks on one node, 2 with one rank per node), which
can change the order of float32 sums inside GEMMs by a few ulps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.netns, pytest.mark.multiproc, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _train(run_dir: Path, toy_prefix: str, *extra: str) -> list[float]:
    args = ["train", "recipe=tiny_cpu", "--dp", "2", "train.train_iters=3",
            "train.eval_interval=0", f"data.prefixes=[{toy_prefix}]", f"train.run_dir={run_dir}",
            *extra]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output[-3000:]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [float(json.loads(line)["loss"]) for line in lines]


def test_two_hosts_match_one_node(
    two_hosts: Path, toy_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A secret travels on ssh's stdin; the remote command stops if it does not arrive.
    monkeypatch.setenv("LLMCTL_TEST_SECRET", "v4lue-never-written")
    multi = _train(
        tmp_path / "two_nodes", toy_prefix, "launcher=torchrun", "--nodes", "2",
        "launcher.secrets=[LLMCTL_TEST_SECRET]",
        f"launcher.hostfile={two_hosts / 'hostfile'}",
        f"launcher.ssh_options=[-F,{two_hosts / 'ssh_config'}]",
    )  # fmt: skip
    logs = tmp_path / "two_nodes" / "logs"
    assert (logs / "node0.log").is_file() and (logs / "node1.log").is_file()
    single = _train(tmp_path / "one_node", toy_prefix)
    assert len(multi) == len(single) == 3
    for step, (a, b) in enumerate(zip(multi, single, strict=True), start=1):
        assert math.isclose(a, b, rel_tol=1e-5), f"step {step}: two hosts {a} vs one node {b}"
    status = runner.invoke(app, ["status", str(tmp_path / "two_nodes"), "--json"])
    assert json.loads(status.output)["state"] == "COMPLETED"


def test_unknown_host_in_hostfile_is_refused(two_hosts: Path, tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h0\nh7\n")  # h7 does not exist
    res = runner.invoke(app, [
        "train", "recipe=tiny_cpu", "launcher=torchrun", "--nodes", "2", "--dp", "2",
        f"launcher.hostfile={hostfile}", f"launcher.ssh_options=[-F,{two_hosts / 'ssh_config'}]",
        f"train.run_dir={tmp_path / 'r'}",
    ])  # fmt: skip
    assert res.exit_code == 2
    assert "host h7 unreachable over ssh" in res.output
    assert not (tmp_path / "r").exists()
