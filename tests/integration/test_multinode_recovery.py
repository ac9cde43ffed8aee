"""A host crash in a two-node run: the launcher brings the node back and training resumes.

Two "hosts" (network namespaces h0 and h1, scripts/netns_hosts.sh) run one rank each (DP=2)
under `llmctl train launcher=torchrun launcher.max_restarts=1`, checkpointing every 2 steps.
Once a checkpoint is committed, every process of the run inside h1's namespace (its torchrun
agent, its rank and the rank's checkpoint helpers) is killed with SIGKILL, as a crashed host
loses them; h1's sshd stays up, so the host "comes back" at once. Nobody acts: the launcher sees
h1's ssh session end with 255, runs h1's rendered node command again, the survivor's agent
(whose rank failed on the broken collective) meets it in a new rendezvous round, and the ranks
resume from the newest complete checkpoint.

Checked: the run finishes at the target step; training restarted exactly at the checkpoint that
was newest when the host died (nothing lost beyond it); every checkpoint validates; and every
step's loss equals a one-node uninterrupted run of the same layout within relative 1e-5 (the
tolerance of test_multinode_train.py: one vs two threads per process can reorder float32 sums
inside GEMMs by a few ulps; a same-layout resume is itself bit-exact on CPU).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from llmctl.run import ckpt_store as store

pytestmark = [pytest.mark.netns, pytest.mark.multiproc, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
NETNS_PREFIX = os.environ.get("LLMCTL_NETNS_PREFIX", "llmctl-")
ITERS = 30  # steps left after the kill at 4: a fast host must still be training
KILL_AFTER_CKPT = 4  # kill h1 once this step's checkpoint is committed
RDZV_PORT = 29517  # not the default: test_multinode_train may run at the same time


def _train_argv(run_dir: Path, toy_prefix: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "llmctl", "train", "recipe=tiny_cpu", "--dp", "2",
        f"train.train_iters={ITERS}", "train.eval_interval=0", "train.log_interval=1",
        "parallel.optimizer_sharding=none",  # the sharding the CPU checkpoints reload
        f"data.prefixes=[{toy_prefix}]", f"train.run_dir={run_dir}", *extra,
    ]  # fmt: skip


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start the CLI as the leader of its own process group (its ssh clients included)."""
    env = {**os.environ, "LLMCTL_WANDB": "off", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _run_processes(run_dir: Path, netns: str | None = None) -> list[psutil.Process]:
    """Processes of this run (command line names its directory) and their descendants."""
    if netns is None:
        candidates = list(psutil.process_iter())
    else:
        pids = subprocess.run(
            ["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=10, check=True
        ).stdout.split()
        candidates = [psutil.Process(int(p)) for p in pids if psutil.pid_exists(int(p))]
    found: dict[int, psutil.Process] = {}
    for proc in candidates:
        with contextlib.suppress(psutil.Error):
            if str(run_dir) in " ".join(proc.cmdline()):
                for p in [proc, *proc.children(recursive=True)]:
                    found.setdefault(p.pid, p)
    return list(found.values())


def _crash_host(run_dir: Path, host: str) -> list[str]:
    """SIGKILL every process of the run inside `host`'s namespace, agents first (not sshd)."""
    victims = _run_processes(run_dir, f"{NETNS_PREFIX}{host}")
    names = []
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            names.append(" ".join(proc.cmdline()))
    victims.sort(key=lambda p: 0 if any("torch.distributed.run" in n for n in _cmd(p)) else 1)
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=10)
    return names


def _cmd(proc: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return [str(arg) for arg in proc.cmdline()]
    return []


@contextlib.contextmanager
def _reaped(proc: subprocess.Popen[bytes], run_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Whatever happens, end the launcher's process group and every process of the run.

    Closing the launcher's ssh clients is not enough: a remote agent waiting silently in a
    rendezvous notices the broken pipe only when it next prints.
    """
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for p in _run_processes(run_dir):  # every namespace: one PID namespace for all
            with contextlib.suppress(psutil.Error):
                p.kill()


def _leftovers(run_dir: Path, timeout_s: float = 10) -> list[str]:
    """Processes of the run still alive `timeout_s` after it ended (killed, then named)."""
    deadline = time.monotonic() + timeout_s
    while (procs := _run_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    names = [" ".join(_cmd(p)) for p in procs]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return names


def _metrics(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(int(r["step"]), float(r["loss"])) for r in map(json.loads, filter(None, lines))]


def _wait_for_checkpoint(run_dir: Path, proc: subprocess.Popen[bytes], step: int) -> None:
    deadline = time.monotonic() + 120
    while (store.read_latest(run_dir / "checkpoints") or 0) < step:
        assert proc.poll() is None, f"run ended early (exit {proc.returncode})"
        assert time.monotonic() < deadline, f"no checkpoint >= {step} within 120 s"
        time.sleep(0.05)


def test_host_crash_rejoins_and_resumes(two_hosts: Path, toy_prefix: str, tmp_path: Path) -> None:
    run = tmp_path / "two_nodes"
    argv = _train_argv(
        run, toy_prefix, "launcher=torchrun", "--nodes", "2", "launcher.max_restarts=1",
        f"launcher.rdzv_port={RDZV_PORT}", "checkpoint.interval=2", "checkpoint.keep_last=20",
        f"launcher.hostfile={two_hosts / 'hostfile'}",
        f"launcher.ssh_options=[-F,{two_hosts / 'ssh_config'}]",
    )  # fmt: skip
    with _reaped(_start(argv, tmp_path / "two_nodes.out"), run) as proc:
        _wait_for_checkpoint(run, proc, KILL_AFTER_CKPT)
        killed = _crash_host(run, "h1")
        newest_at_crash = store.read_latest(run / "checkpoints") or 0
        assert any("torch.distributed.run" in c for c in killed), killed
        assert any("llmctl.train.entry" in c and "torch.distributed.run" not in c for c in killed)
        assert newest_at_crash >= KILL_AFTER_CKPT
        rc = proc.wait(timeout=150)
        assert rc == 0, (tmp_path / "two_nodes.out").read_text(errors="replace")[-3000:]
        node1_log = (run / "logs" / "node1.log").read_text()
        assert "node 1 (h1) lost; running its command again" in node1_log
        assert not _leftovers(run), "processes of the run outlived it"

    # Restarted exactly at the newest complete checkpoint when the host died.
    for rank_log in (run / "logs" / "rank0.log", run / "logs" / "rank1.log"):
        resumed = [int(s) for s in re.findall(r"resumed from iter_(\d+)", rank_log.read_text())]
        assert resumed == [newest_at_crash], (rank_log.name, resumed, newest_at_crash)
    # metrics.jsonl: steps 1..k before the crash (k >= the checkpoint), then from it to the end.
    steps = [s for s, _ in _metrics(run)]
    before = len(steps) - (ITERS - newest_at_crash)
    assert before >= newest_at_crash, steps
    assert steps == [*range(1, before + 1), *range(newest_at_crash + 1, ITERS + 1)], steps
    checkpoints = store.list_checkpoints(run / "checkpoints", full=True)
    assert all(v.ok for v in checkpoints), [(v.path.name, v.reason) for v in checkpoints]
    assert sorted(v.step or 0 for v in checkpoints) == list(range(2, ITERS + 1, 2))
    assert store.read_latest(run / "checkpoints") == ITERS

    # Same losses as one node, same layout, never interrupted.
    ref = tmp_path / "one_node"
    with _reaped(_start(_train_argv(ref, toy_prefix), tmp_path / "one_node.out"), ref) as single:
        assert single.wait(timeout=120) == 0, (tmp_path / "one_node.out").read_text()[-3000:]
    reference = dict(_metrics(ref))
    got = dict(_metrics(run))  # later lines win: the resumed steps
    assert sorted(got) == sorted(reference) == list(range(1, ITERS + 1))
    for step in range(1, ITERS + 1):
        a, b = got[step], reference[step]
        assert math.isclose(a, b, rel_tol=1e-5), f"step {step}: recovered {a} vs one node {b}"
