"""The command a rendered Kubernetes pod runs really trains: rendezvous, preemption, resume.

No cluster runs here, so this test plays kubelet and Kubeflow Trainer for the two pods of a
rendered TrainJob (`launcher=kubernetes`, 2 nodes x 1 rank, tiny CPU recipe). Each "pod" is a
process started with exactly the TrainJob's `trainer.command` and `trainer.env`, plus the
PET_* variables Trainer's torch plugin injects (PET_NNODES = numNodes, PET_NPROC_PER_NODE =
numProcPerNode, PET_NODE_RANK = the Job completion index, PET_MASTER_ADDR, PET_MASTER_PORT) and
the kubelet's `$(VAR)` expansion of the command. Pod K runs on host hK, a network namespace
with its own address and `eth0` (scripts/netns_hosts.sh), as a pod has its own network; the
rendezvous goes over that network to h0, named as the pods name it (`h0` resolves through the
namespace's hosts file, as `<job>-node-0-0.<job>` resolves through the headless service).
PET_MASTER_PORT is a free port rather than Trainer's fixed 29500 (other tests share these
hosts). `python` in the command is the image's interpreter: this virtualenv's, first on PATH.

Then the kubelet's preemption: SIGTERM to one pod's PID 1 (the llmctl node wrapper). All ranks
agree to stop at the end of the step, checkpoint it and exit 143 within the rendered
terminationGracePeriodSeconds. Starting both pods again (what the JobSet's restart does)
resumes from that checkpoint: no step is trained twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("megatron.core")

from ckpt_support import REPO, base_overrides, losses, make_corpus
from run_procs import (
    MARK_ENV,
    assert_no_process_left,
    kill_marked,
    metric_steps,
    new_mark,
)

sys.path.insert(0, str(REPO / "tests" / "unit" / "launch"))
from k8s_support import kubelet_expand

from llmctl.launch.api import prepare_train
from llmctl.run import ckpt_store as store
from llmctl.run.rundir import create_run_dir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pods(trainjob: dict[str, Any], tmp: Path, mark: str) -> list[tuple[list[str], dict]]:
    """(argv, env) of each pod, as kubelet would start them with Trainer's PET_* injected."""
    trainer = trainjob["spec"]["trainer"]
    assert all("value" in e for e in trainer["env"])  # no Secret refs in this run
    port = str(_free_port())
    pods = []
    for rank in range(trainer["numNodes"]):
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp),
            "PYTHONPATH": str(REPO),  # the image has llmctl installed
            "LLMCTL_WANDB": "off",
            MARK_ENV: mark,
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "h0",  # h0's address in every host's hosts file
            "PET_MASTER_PORT": port,
        }
        for e in trainer["env"]:  # the kubelet expands env values too, in order
            env[e["name"]] = kubelet_expand(e["value"], env)
        pods.append(([kubelet_expand(a, env) for a in trainer["command"]], env))
    return pods


NETNS_PREFIX = os.environ.get("LLMCTL_NETNS_PREFIX", "llmctl-")
IP = shutil.which("ip") or "ip"


def _own_hostname(rank: int) -> list[str]:
    """A pod's own hostname, resolvable to its own address (as the kubelet's /etc/hosts does;
    gloo binds to the address its hostname resolves to): hK in a UTS namespace of its own.
    `unshare` and `sh` exec, so the pod's PID stays the command's."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', f"h{rank}"]


def _start(pods: list[tuple[list[str], dict]], tmp: Path, tag: str) -> list[subprocess.Popen]:
    """Pod K's command in host hK's network namespace (`ip netns exec` execs it: the PID that
    gets the preemption SIGTERM is the pod's own PID 1, the llmctl node wrapper)."""
    procs = []
    for rank, (argv, env) in enumerate(pods):
        log = open(tmp / f"pod{rank}-{tag}.log", "wb")  # noqa: SIM115 - owned by the child
        procs.append(
            subprocess.Popen(
                [IP, "netns", "exec", f"{NETNS_PREFIX}h{rank}", *_own_hostname(rank), *argv],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return procs


def _preempt(procs: list[subprocess.Popen], run: Path, tmp: Path, grace_s: int) -> float:
    """SIGTERM pod 1's PID 1; returns seconds until both pods exited (each with 143)."""
    t0 = time.monotonic()
    procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=grace_s + 30) for p in procs]
    took = time.monotonic() - t0
    logs = "".join((tmp / n).read_text()[-2000:] for n in os.listdir(tmp) if n.endswith(".log"))
    assert codes == [143, 143], logs
    return took


def _wait_steps(run: Path, n: int, procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(losses(run)) < n:
        dead = [p.returncode for p in procs if p.poll() is not None]
        assert not dead, f"a pod exited early with {dead}"
        assert time.monotonic() < deadline, f"fewer than {n} steps after {timeout_s:.0f} s"
        time.sleep(0.1)


def test_rendered_pod_command_trains_checkpoints_on_sigterm_and_resumes(
    tmp_path: Path, two_hosts: Path
) -> None:
    corpus = make_corpus(tmp_path / "data" / "corpus")
    runs = tmp_path / "runs"
    run = runs / "k8s-pod"
    launch = prepare_train("tiny_cpu", [
        "launcher=kubernetes", "launcher.k8s.image=registry.example.com/llmctl:0.1",
        "launcher.k8s.pvc=runs", f"launcher.k8s.pvc_mount={runs}", f"train.run_dir={run}",
        "cluster.num_nodes=2", "parallel.dp=2", "checkpoint.interval=1000",
        *base_overrides(corpus, 400),
    ])  # fmt: skip
    create_run_dir(launch.cfg, launch.plan)  # what `llmctl train` writes before submitting
    runtime, trainjob = yaml.safe_load_all(launch.rendering.text)
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    grace_s = pod["spec"]["terminationGracePeriodSeconds"]
    assert trainjob["kind"] == "TrainJob" and trainjob["spec"]["trainer"]["numNodes"] == 2
    mark = new_mark()
    pods = _pods(trainjob, tmp_path, mark)
    assert pods[0][0][-2:] == ["llmctl.train.entry", str(run)]
    try:
        procs = _start(pods, tmp_path, "first")
        _wait_steps(run, 4, procs, 300)
        took = _preempt(procs, run, tmp_path, grace_s)
        saved = store.read_latest(run / "checkpoints")
        assert saved is not None and saved == max(losses(run)), (saved, max(losses(run)))
        assert took < grace_s, f"pods took {took:.1f} s, grace period {grace_s} s"
        rank_log = (run / "logs" / "rank0.log").read_text()
        assert (
            f"preempted by SIGTERM at step {saved}; newest checkpoint is step {saved}" in rank_log
        )
        assert_no_process_left(mark, 15)

        procs = _start(pods, tmp_path, "restart")  # the JobSet restart: same pods again
        _wait_steps(run, saved + 3, procs, 300)
        _preempt(procs, run, tmp_path, grace_s)
        assert_no_process_left(mark, 15)
    finally:
        kill_marked(mark)
    rank_log = (run / "logs" / "rank0.log").read_text()
    assert f"resumed from {store.iter_name(saved)}" in rank_log
    steps = metric_steps(run)
    assert steps == list(range(1, max(steps) + 1)), steps  # every step once: nothing redone
    print(f"k8s pods: preemption checkpoint at step {saved} in {took:.1f} s (grace {grace_s} s)")
