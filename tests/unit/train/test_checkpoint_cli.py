"""`llmctl checkpoints` and `llmctl resume` through Typer's CliRunner (no training)."""

from __future__ import annotations

import json
from pathlib import Path

from test_checkpoint_store import _fake_checkpoint
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.run import ckpt_store as store

runner = CliRunner()


def _run_dir(tmp_path: Path) -> Path:
    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir

    cfg = compose("tiny_cpu", ["train.train_iters=10", f"train.run_dir={tmp_path / 'run'}"])
    return create_run_dir(cfg, None)


def test_checkpoints_json_lists_validity(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    for step in (2, 4):
        _fake_checkpoint(run / "checkpoints", step)
    (run / "checkpoints" / "iter_0000004" / store.TRAIN_STATE).unlink()
    result = runner.invoke(app, ["checkpoints", str(run), "--json", "--quick"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["step"], r["valid"], r["latest"]) for r in rows] == [
        (4, False, True),
        (2, True, False),
    ]
    assert "missing file train_state.json" in rows[0]["problems"]


def test_checkpoints_table_and_missing_dir(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    _fake_checkpoint(run / "checkpoints", 3)
    result = runner.invoke(app, ["checkpoints", str(run), "--quick"])
    assert result.exit_code == 0 and "3 (latest)" in result.output
    missing = runner.invoke(app, ["checkpoints", str(tmp_path / "nope")])
    flat = " ".join(missing.output.replace("│", " ").split())
    assert missing.exit_code == 2 and "is not a run directory (does not exist)" in flat


# `llmctl resume` is tested with real checkpoints in tests/unit/launch/test_reentry.py.


def test_checkpoint_validation_shows_progress_on_stderr(tmp_path: Path) -> None:
    """`llmctl checkpoints` draws one step per checkpoint validated, with an ETA, on stderr
    (forced here: CliRunner's stderr is not a terminal); stdout stays pure JSON."""
    run = _run_dir(tmp_path)
    for step in (2, 4, 6):
        _fake_checkpoint(run / "checkpoints", step)
    result = runner.invoke(
        app, ["checkpoints", str(run), "--json"], env={"LLMCTL_PROGRESS": "1", "COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    assert [r["step"] for r in json.loads(result.stdout)] == [6, 4, 2]
    assert "validate checkpoints" in result.stderr and "3/3" in result.stderr
    assert "ETA" in result.stderr
