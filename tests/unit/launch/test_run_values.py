"""Values a run is launched with: refused up front naming the real key, or defaulted sensibly.

Covers the schedule/checkpoint minimums, the checkpoint interval of a requeueable SLURM job,
and the CPU layouts (`--tp/--pp/--cp` make ranks like `--dp`; no sequence parallelism on CPU).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app

runner = CliRunner()


def _dry_run_json(*args: str) -> dict:
    res = runner.invoke(app, ["train", "recipe=tiny_cpu", *args, "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _refusal(*args: str) -> str:
    res = runner.invoke(app, ["train", "recipe=tiny_cpu", *args, "--dry-run"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.train_iters=0", "train.train_iters must be >= 1, got 0"),
        ("train.train_iters=-5", "train.train_iters must be >= 1, got -5"),
        ("checkpoint.interval=-1", "checkpoint.interval must be >= 0, got -1"),
        ("checkpoint.keep_last=0", "checkpoint.keep_last must be >= 1, got 0"),
        ("checkpoint.max_failed_saves=0", "checkpoint.max_failed_saves must be >= 1, got 0"),
        ("train.global_batch_size=0", "train.global_batch_size must be >= 1, got 0"),
        ("train.log_interval=0", "train.log_interval must be >= 1, got 0"),
        ("launcher.nproc_per_node=-1", "launcher.nproc_per_node must be >= 1 or null"),
        ("launcher.max_restarts=-1", "launcher.max_restarts must be >= 0, got -1"),
        ("launcher.rdzv_port=0", "launcher.rdzv_port must be a TCP port in 1..65535, got 0"),
        ("launcher.rdzv_port=70000", "launcher.rdzv_port must be a TCP port in 1..65535"),
    ],
)
def test_bad_values_name_the_real_key(override: str, message: str) -> None:
    assert message in _refusal(override)


def test_slurm_rendezvous_port_leaves_room_for_the_per_job_offset() -> None:
    # The script listens on rdzv_port + SLURM_JOB_ID % 1000: 65000 + 999 is no TCP port.
    message = _refusal("launcher=slurm", "launcher.rdzv_port=65000")
    assert "launcher.rdzv_port must be a TCP port in 1..64536, got 65000" in message


def test_requeueable_slurm_job_gets_a_checkpoint_interval() -> None:
    cfg = _dry_run_json("launcher=slurm", "train.train_iters=200")["config"]
    assert "  interval: 20\n" in cfg  # a tenth of the run
    cfg = _dry_run_json("launcher=slurm", "checkpoint.interval=7")["config"]
    assert "  interval: 7\n" in cfg  # an explicit interval is kept
    cfg = _dry_run_json("launcher=slurm", "launcher.slurm_requeue=false")["config"]
    assert "  interval: 0\n" in cfg  # not requeued: checkpointing stays as asked
    cfg = _dry_run_json("train.train_iters=200")["config"]
    assert "  interval: 0\n" in cfg  # local runs are not changed


def test_tp_and_pp_make_cpu_ranks_like_dp() -> None:
    out = _dry_run_json("--tp", "2")
    assert out["world_size"] == 2 and "--nproc-per-node=2" in out["command"]
    assert out["layout"]["sequence_parallel"] is False
    out = _dry_run_json("--tp", "2", "--pp", "2")
    assert out["world_size"] == 4 and (out["layout"]["tp"], out["layout"]["pp"]) == (2, 2)
    assert out["layout"]["sequence_parallel"] is False
    out = _dry_run_json("--tp", "2", "--pp", "2", "--gpus-per-node", "4")
    assert out["world_size"] == 4 and out["layout"]["sequence_parallel"] is False
    out = _dry_run_json("--tp", "2", "--gpus-per-node", "4")
    assert out["world_size"] == 4 and out["layout"]["dp"] == 2  # an explicit count is kept


def test_sequence_parallel_on_cpu_is_refused_with_the_reason() -> None:
    text = _refusal("--tp", "2", "parallel.sequence_parallel=true")
    assert "parallel.sequence_parallel=true needs GPUs" in text


def test_cpu_checkpointed_runs_do_not_plan_the_distributed_optimizer() -> None:
    out = _dry_run_json("--dp", "2", "checkpoint.interval=5")
    assert out["layout"]["optimizer_sharding"] == "none"
    text = _refusal("--dp", "2", "checkpoint.interval=5", "parallel.optimizer_sharding=distributed")
    assert "parallel.optimizer_sharding=distributed cannot be checkpointed on CPU" in text


def test_ignore_fit_launches_a_misfit_and_force_is_its_hidden_alias() -> None:
    args = ("cluster.hbm_gib=0.01",)
    assert "--ignore-fit" in _refusal(*args)
    assert _dry_run_json(*args, "--ignore-fit")["plan"]["fits"] is False
    assert _dry_run_json(*args, "--force")["plan"]["fits"] is False
    res = runner.invoke(app, ["train", "recipe=tiny_cpu", *args, "--force", "--dry-run"])
    assert "--force is now --ignore-fit" in res.stderr
    helptext = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output
    assert "--ignore-fit" in helptext and "--force" not in helptext
    helptext = runner.invoke(app, ["resume", "--help"], env={"COLUMNS": "200"}).output
    assert "--ignore-fit" in helptext and "--cluster-file" in helptext and "--tp" in helptext
