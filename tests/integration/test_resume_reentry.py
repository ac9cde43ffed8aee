"""`llmctl resume` on the real local launcher when every checkpoint is damaged.

Refused in one line before any rank starts (exit 2, checkpoints untouched); with
`--restart-from-scratch` the run starts over at step 1 and the damaged checkpoints are kept in
checkpoints/invalid/, out of reach of retention.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.run import ckpt_store as store

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _flip_a_byte(ckpt: Path) -> None:
    shard = next(ckpt.glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x55
    shard.write_bytes(bytes(data))


def test_damaged_checkpoints_refuse_then_restart_explicitly(toy_prefix: str, tmp_path: Path):
    run_dir = tmp_path / "run"
    runner = CliRunner()
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", f"train.run_dir={run_dir}",
              f"data.prefixes=[{toy_prefix}]", "train.train_iters=4", "train.eval_interval=0",
              "checkpoint.interval=2"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    for step in (2, 4):
        _flip_a_byte(run_dir / "checkpoints" / store.iter_name(step))
    launch_before = (run_dir / "launch.json").read_text()

    refused = subprocess.run(
        [sys.executable, "-m", "llmctl", "resume", str(run_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "checksum mismatch" in refused.stderr
    assert (run_dir / "launch.json").read_text() == launch_before  # nothing started
    assert store.committed_steps(run_dir / "checkpoints") == [2, 4]

    res = runner.invoke(app, ["resume", str(run_dir), "--restart-from-scratch", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["exit_code"] == 0  # the ranks' output went to stderr
    invalid = run_dir / "checkpoints" / store.INVALID_DIR
    assert sorted(p.name for p in invalid.iterdir() if p.is_dir()) == [
        "iter_0000002", "iter_0000004",
    ]  # fmt: skip
    assert "checksum mismatch" in (invalid / "iter_0000004.reason.txt").read_text()
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-4:] == [1, 2, 3, 4]  # trained again from step 1
    assert all(v.ok for v in store.list_checkpoints(run_dir / "checkpoints", full=True))
    assert store.committed_steps(run_dir / "checkpoints") == [2, 4]
