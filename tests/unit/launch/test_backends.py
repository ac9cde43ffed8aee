"""The launcher protocol: one registry from `launcher.kind` to backend, a pure config step,
and status/logs/cancel of a run directory through the backend its launch record names."""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.launch.api import resolve_config, write_launch
from llmctl.launch.backend import BACKENDS, backend_for


def test_every_launcher_kind_has_a_backend_and_only_those() -> None:
    from llmctl.config import LauncherKind

    assert set(BACKENDS) == {str(k) for k in LauncherKind}
    for kind in BACKENDS:
        backend = backend_for(kind)
        assert type(backend).__name__.lower().startswith(kind)


def test_an_unknown_kind_names_the_registered_ones() -> None:
    with pytest.raises(UserError) as refused:
        backend_for("k8s")
    assert refused.value.message == (
        "unknown launcher.kind 'k8s': use local, torchrun, slurm or kubernetes"
    )


def test_resolving_the_launch_config_leaves_the_composed_one_as_it_is(tmp_path: Path) -> None:
    from llmctl.config import compose

    composed = compose(
        "tiny_cpu",
        ["launcher=slurm", "parallel.dp=2", "train.train_iters=40", "data.cache_dir=cache",
         "train.run_dir=runs/r"],
    )  # fmt: skip
    before = copy.deepcopy(composed)
    cfg = resolve_config(composed, backend_for("slurm"), force=True)
    assert composed == before  # nothing changed in place
    assert cfg.train.force and cfg.train.run_dir == str(Path("runs/r").resolve())
    assert cfg.checkpoint.interval == 4  # a requeueable job checkpoints: train_iters // 10
    assert cfg.cluster.gpus_per_node == 2  # CPU ranks follow the layout (DP 2)
    assert cfg.data.cache_dir == os.path.abspath("cache")
    local = resolve_config(composed, backend_for("local"), force=False)
    assert local.checkpoint.interval == 0 and not local.train.force


def _record(run_dir: Path, **fields: object) -> None:
    run_dir.mkdir(exist_ok=True)
    (run_dir / "config.yaml").write_text("recipe: tiny_cpu\ntrain:\n  train_iters: 7\n")
    write_launch(run_dir, {"run_dir": str(run_dir), **fields})


def test_cancel_sends_sigterm_to_the_launcher_of_a_local_run(tmp_path: Path) -> None:
    from llmctl.launch.jobs import cancel_run, run_status

    launcher = subprocess.Popen(["sleep", "60"])
    try:
        run = tmp_path / "run"
        _record(run, kind="local", pid=launcher.pid, host=socket.gethostname(), started=time.time())
        assert run_status(str(run)).state == "RUNNING"
        cancel_run(run)
        assert launcher.wait(timeout=10) == -15
        assert run_status(str(run)).state == "EXITED"
        with pytest.raises(UserError, match="is not running on this host"):
            cancel_run(run)
    finally:
        launcher.kill()
        launcher.wait()
    done = tmp_path / "done"
    _record(done, kind="torchrun", pid=os.getpid(), exit_code=0)
    cancel_run(done)  # a finished run is left as it is (this process is still alive)
    status = run_status(str(done))
    assert (status.kind, status.state, status.total_steps) == ("torchrun", "COMPLETED", 7)


def test_logs_come_from_the_file_the_backend_names(tmp_path: Path) -> None:
    from llmctl.launch.jobs import follow_logs

    for kind, rel in (("local", "logs/launcher.log"), ("torchrun", "logs/node0.log"),
                      ("slurm", "slurm-42.out")):  # fmt: skip
        run = tmp_path / kind
        _record(run, kind=kind, job_id="42", exit_code=0)
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(f"output of {kind}\n")
        chunks: list[str] = []
        follow_logs(run, chunks.append)
        assert chunks == [f"output of {kind}\n"]


def _local_slurm() -> dict[str, str]:
    conf = os.environ.get("SLURM_CONF") or "/tmp/llmctl-slurm/etc/slurm.conf"
    if shutil.which("sbatch") is None or not Path(conf).is_file():
        pytest.skip("no local SLURM cluster (scripts/slurm_local.sh up)")
    return {"SLURM_CONF": conf}


@pytest.mark.slurm
def test_slurm_submit_refusal_and_cancel_on_the_real_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmctl.launch.slurm import SlurmBackend, _scontrol_job
    from llmctl.sbatch import SbatchFailed, submit

    for key, value in _local_slurm().items():
        monkeypatch.setenv(key, value)
    script = tmp_path / "sleep.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/slurm-%j.out\nsleep 120\n")
    with pytest.raises(SbatchFailed) as refused:
        submit(["--partition=no-such-partition", str(script)])
    assert "partition" in refused.value.last_line.lower()
    assert refused.value.message.startswith("sbatch failed: ")
    job_id = submit([str(script)], cwd=tmp_path)
    assert job_id.isdigit()
    SlurmBackend().cancel(tmp_path, {"job_id": job_id})
    deadline = time.monotonic() + 30
    while _scontrol_job(job_id).get("JobState") not in ("CANCELLED", "GONE"):
        assert time.monotonic() < deadline, _scontrol_job(job_id)
        time.sleep(0.5)
