"""The elastic question: best layout on N nodes a checkpoint can be resharded to.

`llmctl.plan.reshard` (pure) and `llmctl plan --nodes N --from-checkpoint CKPT`. The 405B
checkpoint here is its train_state.json as `llmctl train` writes it (the header of
`train.checkpoint`: the run's resolved config and layout record, made by the same functions),
without weights: the question reads nothing else. A real CPU checkpoint is re-planned in
tests/integration/test_plan_from_checkpoint.py.
"""

from __future__ import annotations

import json
import time
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.config import cfg_to_yaml, compose
from llmctl.plan import Constraints, Layout, PlanInput, Sharding, plan
from llmctl.plan.reshard import reshard_input, reshard_plan
from llmctl.run.layout import layout_record
from llmctl.run.planning import plan_input

RECIPE = "llama31_405b_pretrain_1024gpu_h100_fp8"
SAVED = Layout(tp=8, pp=8, vpp=8, cp=2, dp=8, sequence_parallel=True)


@cache
def _inp() -> PlanInput:
    return plan_input(compose(RECIPE, []))


def _checkpoint(tmp: Path, saved: Layout = SAVED) -> Path:
    cfg = compose(RECIPE, [])
    ckpt = tmp / "run" / "checkpoints" / "iter_0000100"
    ckpt.mkdir(parents=True)
    state = {
        "step": 100,
        "layout": layout_record(saved, cfg.train.global_batch_size),
        "config_yaml": cfg_to_yaml(cfg),
    }
    (ckpt / "train_state.json").write_text(json.dumps(state))
    return ckpt


def test_sharding_is_pinned_and_the_rest_is_free() -> None:
    inp = reshard_input(_inp(), 96, Sharding.distributed)
    assert inp.cluster.world_size == 768
    assert inp.constraints.optimizer_sharding == Sharding.distributed
    assert inp.constraints.tp is None and inp.constraints.dp is None
    res = reshard_plan(_inp(), 96, Sharding.distributed)
    assert res.best is not None
    assert all(e.layout.optimizer_sharding == Sharding.distributed for e in res.ranked)
    assert res.best.layout.tp * res.best.layout.pp * res.best.layout.cp * res.best.layout.dp == 768
    # the answer is the full search's best among layouts of that sharding
    full = plan(reshard_input(_inp(), 96, Sharding.distributed), suggest=False)
    assert res.best.layout == full.best.layout  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="cannot be converted"):
        reshard_input(
            _inp(), 96, Sharding.distributed, Constraints(optimizer_sharding=Sharding.full)
        )


def test_405b_on_1024_gpus_answers_in_under_1s_cpu() -> None:
    from tests.unit.plan.test_plan_speed import _clear_caches, _scale

    best = float("inf")
    for _ in range(2):
        _clear_caches()
        t = time.process_time()
        res = reshard_plan(_inp(), 128, Sharding.distributed)
        best = min(best, time.process_time() - t)
    assert res.best is not None and res.num_candidates > 1000
    print(f"405B on 1024 GPUs: {best:.3f} s CPU, {res.num_candidates} candidates")
    assert best < 1.0 * _scale(), f"{best:.3f} s CPU"


def test_cli_from_checkpoint(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path)
    runner = CliRunner()
    for where in (ckpt, tmp_path / "run"):  # the checkpoint, or its run's newest
        res = runner.invoke(
            app, ["plan", "--nodes", "96", "--from-checkpoint", str(where), "--json"]
        )
        assert res.exit_code == 0, res.output
        ranked = json.loads(res.stdout)["ranked"]
        assert ranked and all(r["layout"]["optimizer_sharding"] == "distributed" for r in ranked)
        lay = ranked[0]["layout"]
        assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] == 768
        assert "step 100" in res.stderr and "optimizer sharding distributed" in res.stderr
    fixed = runner.invoke(
        app, ["plan", "--nodes", "96", "--tp", "8", "--from-checkpoint", str(ckpt), "--json"]
    )
    assert fixed.exit_code == 0 and all(
        r["layout"]["tp"] == 8 for r in json.loads(fixed.stdout)["ranked"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-checkpoint", "CKPT"], "needs --nodes N"),
        (["--nodes", "4", "--from-checkpoint", "NOPE"], "not a checkpoint"),
        (["recipe=tiny_cpu", "--nodes", "4", "--from-checkpoint", "CKPT"], "drop recipe="),
    ],
)
def test_cli_from_checkpoint_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    ckpt = _checkpoint(tmp_path)
    args = [str(ckpt) if a == "CKPT" else str(tmp_path / a) if a == "NOPE" else a for a in args]
    res = CliRunner().invoke(app, ["plan", *args], env={"COLUMNS": "400"})
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output


def test_fsdp_checkpoint_keeps_the_dimensions_not_measured_to_reshard(tmp_path: Path) -> None:
    """An FSDP checkpoint reshards over TP, PP and DP (measured, docs/train.md) but keeps its
    VPP and CP: every answer has the saved VPP and CP, some answer changes TP, PP or DP for
    the new node count, and an override of CP is refused."""
    saved = Layout(tp=8, pp=8, vpp=8, cp=2, dp=8, optimizer_sharding=Sharding.full)
    ckpt = _checkpoint(tmp_path, saved)
    runner = CliRunner()
    res = runner.invoke(app, ["plan", "--nodes", "64", "--from-checkpoint", str(ckpt), "--json"])
    assert res.exit_code == 0, res.output
    ranked = json.loads(res.stdout)["ranked"]
    assert ranked
    for r in ranked:
        lay = r["layout"]
        assert (lay["vpp"], lay["cp"]) == (8, 2)
        assert lay["optimizer_sharding"] == "full"
    moved = [
        r for r in ranked if (r["layout"]["tp"], r["layout"]["pp"], r["layout"]["dp"]) != (8, 8, 8)
    ]
    assert moved
    res = runner.invoke(
        app, ["plan", "--nodes", "64", "--cp", "1", "--from-checkpoint", str(ckpt)],
        env={"COLUMNS": "400"},
    )  # fmt: skip
    assert res.exit_code == 2
    assert "resumes only with cp=2" in res.output and "Traceback" not in res.output
