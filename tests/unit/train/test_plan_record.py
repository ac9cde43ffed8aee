"""plan.json is a typed, versioned record; files earlier versions wrote still read.

Fixtures (tests/fixtures/run/) were written by the code of the commit in their name:
`plan_886b8a4_*` by the last version before plan.json carried `version`, `plan_c0a25b9_*` by
the first one that wrote a plan (its layout has no `loss_balanced` and no `etp`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.launch.api import plan_check
from llmctl.plan import PLAN_RECORD_VERSION, Layout, PlanRecord, Recompute, Sharding
from llmctl.run.ckpt_compat import check_compatible
from llmctl.run.layout import layout_from_record, layout_record, resolve_layout
from llmctl.run.rundir import PLAN_FILE, create_run_dir, read_plan

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "run"


def _run_dir(tmp_path: Path, fixture: str) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(FIXTURES / fixture, run_dir / PLAN_FILE)
    return run_dir


def test_plan_json_of_886b8a4_reads_and_shows_as_it_was_written(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, "plan_886b8a4_tiny_dp2.json")
    plan = read_plan(run_dir)
    assert plan is not None and plan.version == 1
    assert plan.layout == Layout(dp=2, micro_batch_size=4)  # its etp 1 is TP: unset
    assert (plan.step_time_s, plan.peak_mem_gib) == (0.030755120284519998, 0.3140111446380615)
    # what `train --dry-run` and a checkpoint's train_state.json show: the file's keys as written
    assert plan.as_dict() == json.loads((run_dir / PLAN_FILE).read_text())


def test_plan_json_of_886b8a4_moe_keeps_its_expert_tp(tmp_path: Path) -> None:
    plan = read_plan(_run_dir(tmp_path, "plan_886b8a4_mixtral_tp2_etp1.json"))
    assert plan is not None
    assert (plan.layout.tp, plan.layout.etp, plan.layout.vpp, plan.layout.ep) == (2, 1, 8, 8)
    assert plan.layout.short() == plan.layout_name
    cfg = compose("mixtral_8x7b_pretrain_64gpu_h100_bf16", ["parallel.etp=1"])
    layout = resolve_layout(cfg, 64, plan.layout)
    assert (layout.tp, layout.etp, layout.sequence_parallel) == (2, 1, True)


def test_plan_json_of_c0a25b9_without_etp_and_loss_balance_reads(tmp_path: Path) -> None:
    plan = read_plan(_run_dir(tmp_path, "plan_c0a25b9_tiny_dp2.json"))
    assert plan is not None and plan.version == 1
    assert plan.layout == Layout(dp=2, micro_batch_size=4, optimizer_sharding=Sharding.distributed)
    assert plan.layout.etp is None and not plan.layout.loss_balanced


def test_new_plan_json_is_the_old_keys_after_a_version(tmp_path: Path) -> None:
    cfg = compose("tiny_cpu", ["parallel.dp=2", f"train.run_dir={tmp_path / 'run'}"])
    plan = plan_check(cfg, force=False)
    run_dir = create_run_dir(cfg, plan)
    written = json.loads((run_dir / PLAN_FILE).read_text())
    assert list(written) == ["version", *plan.as_dict()] and written["version"] == 2
    assert PLAN_RECORD_VERSION == 2
    old = json.loads((FIXTURES / "plan_886b8a4_tiny_dp2.json").read_text())
    assert list(plan.as_dict()) == list(old) and list(plan.as_dict()["layout"]) == list(
        old["layout"]
    )
    assert read_plan(run_dir) == plan


def test_unreadable_plan_json_is_one_line_naming_the_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert read_plan(run_dir) is None  # no plan.json
    (run_dir / PLAN_FILE).write_text("{}\n")
    assert read_plan(run_dir) is None  # a run without a plan
    newer = json.loads((FIXTURES / "plan_886b8a4_tiny_dp2.json").read_text()) | {"version": 3}
    (run_dir / PLAN_FILE).write_text(json.dumps(newer))
    with pytest.raises(UserError, match=r"plan\.json: .*version 3 is not one this llmctl reads"):
        read_plan(run_dir)
    del newer["version"], newer["step_time_s"]
    (run_dir / PLAN_FILE).write_text(json.dumps(newer))
    with pytest.raises(UserError, match=r"plan\.json: not a plan .*no 'step_time_s'"):
        read_plan(run_dir)
    (run_dir / PLAN_FILE).write_text("{")
    with pytest.raises(UserError, match=r"plan\.json: not a plan written by `llmctl train`"):
        read_plan(run_dir)


def test_layout_record_is_the_form_886b8a4_saved() -> None:
    """perf.json, train_state.json and `train --dry-run --json` keep the runner's saved form:
    `vpp` null without interleaving, `etp` null when unset, the global batch alongside. The
    records below were printed by 886b8a4's `TrainLayout.as_dict()`."""
    cfg = compose("tiny_cpu", ["parallel.pp=2", "parallel.vpp=2", "model.num_layers=4"])
    planned = resolve_layout(cfg, None, plan_check(cfg, force=True).layout)
    assert json.dumps(layout_record(planned, 8)) == (
        '{"tp": 1, "pp": 2, "vpp": 2, "cp": 1, "ep": 1, "dp": 1, "micro_batch_size": 4, '
        '"global_batch_size": 8, "sequence_parallel": false, "recompute": "none", '
        '"optimizer_sharding": "none", "moe_a2a_overlap": false, "etp": 1}'
    )
    cfg = compose("tiny_cpu", ["parallel.dp=2"])
    assert json.dumps(layout_record(resolve_layout(cfg), 8)) == (
        '{"tp": 1, "pp": 1, "vpp": null, "cp": 1, "ep": 1, "dp": 2, "micro_batch_size": 4, '
        '"global_batch_size": 8, "sequence_parallel": false, "recompute": "none", '
        '"optimizer_sharding": "none", "moe_a2a_overlap": false, "etp": null}'
    )


def test_saved_layout_records_read_back_and_compare() -> None:
    saved = {
        "tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "dp": 2, "micro_batch_size": 4,
        "global_batch_size": 8, "sequence_parallel": False, "recompute": "none",
        "optimizer_sharding": "none", "moe_a2a_overlap": False, "etp": None,
    }  # fmt: skip
    layout = layout_from_record(saved)
    assert layout == Layout(dp=2, micro_batch_size=4, optimizer_sharding=Sharding.none)
    assert layout_record(layout, 8) == saved
    assert layout_from_record({"tp": 2, "pp": 2, "dp": 1, "micro_batch_size": 1}) == Layout(
        tp=2, pp=2, optimizer_sharding=Sharding.none, recompute=Recompute.none
    )
    cfg = compose("tiny_cpu", ["parallel.dp=2"])
    assert check_compatible({"layout": saved}, cfg, resolve_layout(cfg, 2)) == []
    other = compose("tiny_cpu", ["parallel.tp=2"])
    assert check_compatible({"layout": saved}, other, resolve_layout(other, 2)) == ["tp", "dp"]


def test_resume_pins_the_sharding_an_old_plan_json_recorded(tmp_path: Path) -> None:
    from llmctl.launch.ckpt_resume import _pinned_sharding

    run_dir = _run_dir(tmp_path, "plan_c0a25b9_tiny_dp2.json")
    saved = compose("tiny_cpu", [])
    assert _pinned_sharding(run_dir, saved, []) == ["parallel.optimizer_sharding=distributed"]


def test_plan_record_of_an_evaluation_is_what_plan_json_held() -> None:
    cfg = compose("tiny_cpu", ["parallel.dp=2"])
    plan = plan_check(cfg, force=False)
    assert isinstance(plan, PlanRecord) and plan.layout_name == plan.layout.short()
    assert plan.tokens_per_s > 0 and plan.fits and set(plan.memory_gib) >= {"weights", "grads"}
