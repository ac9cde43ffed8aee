"""`llmctl plan --calibrate` on real CPU training runs (megatron-core, gloo; 6 launches).

Calibrate on one finished run (4 layers, 1 rank, MBS 4), write the calibrated cluster file,
plan a different layout (PP=2 on 2 ranks, MBS 2, no VPP) with `--cluster-file`, and compare
with that layout's measured step time, on the shipped local_cpu.yaml.

Measured step times are load-corrected (metrics.jsonl `cpu_share`, from Linux schedstat: the
bottleneck rank's waits for a CPU taken out; the 20th percentile of the steady-state steps),
so other processes slow the wall clock but much less the figure compared; calibration absorbs
a uniformly faster or slower host.

What is asserted: the calibration reproduces the run it was fitted on within 10 %, the file is
written and used by later plans, train's perf.json/perf.md carry the load-corrected step time,
and the other layout is predicted within 25 % (the issue's 15 % is for the calibrated run's
own layout, test_plan_probe_cpu.py). Measured errors: docs/planner.md, Calibration. What is
left is run-to-run noise of the measurement, not a term of the model: the host's speed moves
between runs, and under load the ranks' own CPU seconds grow, which no wait correction
removes. 48 steps each: the launches' start-up dominates. Each layout runs three times
(alternated) and the fastest run of each is used, on both sides alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.config import compose
from llmctl.run.planning import load_measured_run
from llmctl.run.rundir import create_run_dir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
BASE = ["model.num_layers=4", "train.train_iters=48", "train.eval_interval=0"]


def _train(tmp: Path, name: str, cache: Path, overrides: list[str], nproc: int) -> Path:
    run_dir = tmp / name
    cfg = compose(
        "tiny_cpu", [*BASE, *overrides, f"data.cache_dir={cache}", f"train.run_dir={run_dir}"]
    )
    create_run_dir(cfg, None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
         "--standalone", "-m", "llmctl.train.entry", str(run_dir)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_calibrated_plan_predicts_another_layout(tmp_path: Path) -> None:
    from llmctl.data.demo import prepare_demo_data

    cache = tmp_path / "cache"
    prepare_demo_data(cache)
    # Each layout runs three times, alternated, and the fastest run of each is compared: this
    # shared host's speed drifts by 10-50 % over minutes (one-rank runs of one config measured
    # 107-233 ms within an hour on 2026-12-03; the PP=2 runs of one set 115, 132 and 168 ms),
    # which a single pair of runs takes as a model error; a slow period only inflates.
    runs: dict[str, list[Path]] = {"mbs4": [], "pp2": []}
    for k in range(3):
        runs["mbs4"].append(
            _train(tmp_path, f"mbs4-{k}", cache, ["parallel.micro_batch_size=4"], 1)
        )
        pp2 = ["parallel.pp=2", "parallel.micro_batch_size=2"]
        runs["pp2"].append(_train(tmp_path, f"pp2-{k}", cache, pp2, 2))
    one, two = (min(r, key=lambda d: load_measured_run(d).step_s) for r in runs.values())
    out = tmp_path / "calibrated.yaml"
    runner = CliRunner()
    args = ["plan", "recipe=tiny_cpu", *BASE, "--json"]
    fixed = ["--tp", "1", "--pp", "1", "--mbs", "4"]
    res = runner.invoke(app, [*args, *fixed, "--calibrate", str(one), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("# Written by `llmctl plan --calibrate`")
    fitted = json.loads(res.stdout)["ranked"][0]["step_s"]
    assert fitted == pytest.approx(load_measured_run(one).step_s, rel=0.10)
    layout = ["--pp", "2", "--vpp", "1", "--mbs", "2", "--gpus-per-node", "2"]
    later = runner.invoke(app, [*args, "--cluster-file", str(out), *layout])
    assert later.exit_code == 0, later.output
    predicted = json.loads(later.stdout)["ranked"][0]["step_s"]
    measured = load_measured_run(two).step_s
    perf = json.loads((two / "perf.json").read_text())  # train's predicted-vs-measured record
    assert perf["load_corrected_step_s"] == pytest.approx(measured)
    assert "| step time, load-corrected (s) |" in (two / "perf.md").read_text()
    print(
        f"PP2/MBS2 predicted {predicted:.4f} s, measured {measured:.4f} s, error "
        f"{predicted / measured - 1:+.1%}; calibration run {load_measured_run(one).step_s:.4f} s;"
        f" runs {[round(load_measured_run(d).step_s, 4) for r in runs.values() for d in r]} s"
    )
    assert predicted == pytest.approx(measured, rel=0.25)
