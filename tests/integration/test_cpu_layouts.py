"""`llmctl train --tp 2 --pp 2` on the CPU cluster: four real torchrun ranks train to the end.

`--tp/--pp/--cp` make ranks on CPU as `--dp` does, and sequence parallelism (which the plan
picks for TP > 1 on GPUs) stays off on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def test_tp2_pp2_trains_on_four_cpu_ranks(toy_prefix: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["train", "recipe=tiny_cpu", "--tp", "2", "--pp", "2", f"train.run_dir={run_dir}",
              f"data.prefixes=[{toy_prefix}]", "train.train_iters=3", "train.eval_interval=0",
              "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["exit_code"] == 0
    layout = json.loads((run_dir / "plan.json").read_text())["layout"]
    assert (layout["tp"], layout["pp"], layout["dp"]) == (2, 2, 1)
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == [
        f"rank{r}.log" for r in range(4)
    ]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(math.isfinite(s["loss"]) for s in steps)
