"""`llmctl train --dry-run` and the launcher checks that refuse to start (real ssh, real PATH)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app

runner = CliRunner()


def test_dry_run_json_shows_command_layout_and_config(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", f"train.run_dir={run_dir}", "--dp", "2", "--dry-run",
              "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["kind"] == "local" and out["world_size"] == 2
    assert out["command"][-3:] == ["-m", "llmctl.train.entry", str(run_dir)]
    assert "--nproc-per-node=2" in out["command"]
    assert "train_iters: 50" in out["config"]
    assert not run_dir.exists()  # a dry run creates nothing


def test_dry_run_slurm_prints_the_script(tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", "launcher=slurm", f"train.run_dir={tmp_path / 'r'}",
              "--dp", "2", "--dry-run"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "#SBATCH --open-mode=append" in res.output
    assert "#SBATCH --signal=B:USR1@90" in res.output
    assert not (tmp_path / "r").exists()


def test_slurm_without_sbatch_is_refused_before_anything(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", "launcher=slurm", f"train.run_dir={run_dir}"],
        env={"PATH": str(tmp_path)},
    )  # fmt: skip
    assert res.exit_code == 2
    assert "sbatch not found on PATH" in res.output
    assert not run_dir.exists()


def test_unreachable_host_is_refused_naming_it(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("no-such-host.invalid\n")
    run_dir = tmp_path / "r"
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", "launcher=torchrun", f"launcher.hostfile={hostfile}",
              f"train.run_dir={run_dir}"],
    )  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "host no-such-host.invalid unreachable over ssh" in res.output
    assert not run_dir.exists()


def test_torchrun_without_hostfile_names_the_key() -> None:
    res = runner.invoke(app, ["train", "recipe=tiny_cpu", "launcher=torchrun", "--dry-run"])
    assert res.exit_code == 2
    assert "launcher.hostfile" in res.output


def test_layout_the_world_cannot_hold_is_refused() -> None:
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", "launcher.nproc_per_node=3", "--dp", "2", "--dry-run"]
    )
    assert res.exit_code == 2
    assert "launcher.nproc_per_node=3" in res.output and "TP*PP*CP*DP" in res.output


def test_layout_predicted_not_to_fit_is_refused_unless_forced(tmp_path: Path) -> None:
    args = ["train", "recipe=tiny_cpu", "cluster.hbm_gib=0.01", f"train.run_dir={tmp_path}/r",
            "--dry-run", "--json"]  # fmt: skip
    refused = runner.invoke(app, args)
    assert refused.exit_code == 2
    assert "GiB per device but" in refused.output and "--ignore-fit" in refused.output
    forced = runner.invoke(app, [*args, "--ignore-fit"])
    assert forced.exit_code == 0, forced.output
    plan = json.loads(forced.output)["plan"]
    assert plan["fits"] is False and plan["peak_mem_gib"] > plan["usable_gib"]


def test_fsdp_is_planned_as_the_runner_runs_it() -> None:
    base = ["train", "recipe=tiny_cpu", "parallel.optimizer_sharding=full", "--dry-run"]
    res = runner.invoke(app, [*base, "checkpoint.interval=5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["layout"]["optimizer_sharding"] == "full"
    # priced as the runner runs FSDP (megatron-core's torch FSDP2 wrapper), not Megatron-FSDP
    from llmctl.config import compose
    from llmctl.run.planning import plan_config

    def weights_gib(fsdp: str) -> float:
        cfg = compose("tiny_cpu", ["parallel.optimizer_sharding=full", f"plan.fsdp={fsdp}"])
        best = plan_config(cfg).best
        assert best is not None
        return best.memory.weights_gib

    assert out["plan"]["memory_gib"]["weights"] == pytest.approx(weights_gib("torch_fsdp2"))
    assert weights_gib("torch_fsdp2") != pytest.approx(weights_gib("megatron_fsdp"))


FAKE_TORCHRUN = """#!/bin/sh
echo "rank chatter on stdout"
echo "rank chatter on stderr" >&2
exit 0
"""


def _toy_prefix(tmp_path: Path) -> str:
    import numpy as np

    from llmctl.data.indexed import ShardWriter

    prefix = tmp_path / "data" / "toy"
    prefix.parent.mkdir()
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(np.arange(100 * 64) % 4096, np.full(100, 64))
    writer.close()
    return str(prefix)


def test_json_stdout_of_train_and_resume_is_only_json(tmp_path: Path) -> None:
    # The launcher is real (torchrun's place taken by a script printing like the ranks do):
    # with --json the run's output goes to stderr, for `resume` as for `train`.
    python = tmp_path / "python"
    python.write_text(FAKE_TORCHRUN)
    python.chmod(0o755)
    run_dir = tmp_path / "run"
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", f"train.run_dir={run_dir}", f"launcher.python={python}",
              f"data.prefixes=[{_toy_prefix(tmp_path)}]", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"kind": "local", "run_dir": str(run_dir), "exit_code": 0}
    assert "rank chatter on stdout" in res.stderr
    res = runner.invoke(app, ["resume", str(run_dir), "--restart-from-scratch", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"kind": "local", "run_dir": str(run_dir), "exit_code": 0}
    assert "rank chatter on stdout" in res.stderr and "rank chatter" not in res.stdout
