"""No process of a two-host ssh run outlives it on any host (launcher=torchrun over ssh).

The hosts h0 and h1 are network namespaces with their own sshd (scripts/netns_hosts.sh). They
share this machine's PID namespace, so /proc here sees every host's processes. The run's nodes
get `launcher.env.LLMCTL_TEST_MARK=<mark>` inlined in their remote commands, so every process
of the run on every host (node wrapper, torchrun agent, ranks, megatron's checkpoint Manager,
forked writers) carries the mark, as does the local `llmctl train` and its ssh clients.

- Launcher killed: SIGKILL to `llmctl train` alone. Its ssh clients get SIGTERM from the kernel
  (PR_SET_PDEATHSIG); each remote node wrapper sees its standard input close and stops its
  torchrun; the ranks checkpoint the step they are in and exit. sshd sends no signal to a
  command without a terminal: before, the remote agents and ranks trained on.
- Rank crash: SIGKILL to h1's rank (no restarts): `llmctl train` returns non-zero and nothing
  of the run is left on either host (the killed rank's checkpoint helpers included).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from ckpt_support import base_overrides, losses, make_corpus
from run_procs import (
    assert_no_process_left,
    kill_marked,
    marked_pids,
    new_mark,
    start_cli,
    wait_until,
)

from llmctl.run import ckpt_store as store

pytestmark = [pytest.mark.netns, pytest.mark.multiproc, pytest.mark.slow]
RDZV_PORT = 29521  # not the default: other multi-node tests may run at the same time


def _start(run_dir: Path, hosts: Path, corpus: Path, mark: str, log: Path, *extra: str):
    args = ["train", "recipe=tiny_cpu", "--dp", "2", "--nodes", "2", "launcher=torchrun",
            f"train.run_dir={run_dir}", *base_overrides(corpus, 400),
            "parallel.optimizer_sharding=none",  # the sharding the CPU checkpoints reload
            f"launcher.rdzv_port={RDZV_PORT}", f"launcher.env.LLMCTL_TEST_MARK={mark}",
            "launcher.env.LLMCTL_WANDB=off",
            f"launcher.hostfile={hosts / 'hostfile'}",
            f"launcher.ssh_options=[-F,{hosts / 'ssh_config'}]", *extra]  # fmt: skip
    return start_cli(args, mark, log)


def _remote_rank(mark: str, node_rank: str) -> int:
    """PID of the training rank of node `node_rank` (not its agent or wrapper)."""
    for pid in marked_pids(mark):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        is_rank = "llmctl.train.entry" in cmd and "torch.distributed.run" not in cmd
        if is_rank and f"LLMCTL_NODE_RANK={node_rank}".encode() in env:
            return pid
    raise AssertionError(f"no rank of node {node_rank} found")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared indexed dataset of this module."""
    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


def test_killed_launcher_leaves_nothing_on_any_host(
    two_hosts: Path, corpus: Path, tmp_path: Path
) -> None:
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    proc = _start(run_dir, two_hosts, corpus, mark, log, "checkpoint.interval=50")
    try:
        wait_until(lambda: len(losses(run_dir)) >= 3, 180, "3 steps")
        assert proc.poll() is None, log.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # llmctl train alone: not its ssh clients
        proc.wait(timeout=30)
        assert_no_process_left(mark, 90)  # the ranks checkpoint, then every host is clean
    finally:
        kill_marked(mark)
    stopped_at = max(losses(run_dir))
    assert store.read_latest(run_dir / "checkpoints") == stopped_at, log.read_text()[-3000:]


def test_rank_crash_leaves_nothing_on_any_host(
    two_hosts: Path, corpus: Path, tmp_path: Path
) -> None:
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    proc = _start(run_dir, two_hosts, corpus, mark, log, "checkpoint.interval=2")
    try:
        wait_until(lambda: (store.read_latest(run_dir / "checkpoints") or 0) >= 2, 180, "iter 2")
        os.kill(_remote_rank(mark, "1"), signal.SIGKILL)
        rc = proc.wait(timeout=120)
        assert_no_process_left(mark, 30)
    finally:
        kill_marked(mark)
    assert rc != 0, log.read_text()[-3000:]
