"""What the hang watchdog and the divergence guard cost a training run: `train.health` off vs on.

Run: `python benchmarks/health_overhead.py [--steps 150] [--reps 3]`.

Side by side, alternated (off, on, on, off, ...) in fresh one-rank processes
(`python -m llmctl.train.entry RUN_DIR`, recipe tiny_cpu, OMP_NUM_THREADS=1) so machine load
drifts hit both alike. "Off" is `train.health.watchdog=false train.health.on_divergence=off`
(megatron's plain `optimizer.step()`); "on" is the default (watchdog thread, heartbeat every
`heartbeat_interval_s(hang_floor_s)` = 5 s; guarded step with the `stop` policy). Per run: the
process's CPU seconds (user + sys, from wait4, every thread included) and the median step time
of metrics.jsonl. Then, in this process, the direct costs: one `Watchdog.beat()` (the loop
calls it twice per step) and one heartbeat write (the thread's work per interval).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OFF = ["train.health.watchdog=false", "train.health.on_divergence=off"]


def _run(root: Path, name: str, steps: int, on: bool) -> dict[str, float]:
    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir

    run_dir = root / name
    overrides = [f"train.train_iters={steps}", "train.eval_interval=0", f"train.run_dir={run_dir}"]
    overrides += [f"data.cache_dir={root / 'cache'}", *([] if on else OFF)]
    create_run_dir(compose("tiny_cpu", overrides), None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LLMCTL_WANDB": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmctl.train.entry", str(run_dir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{name}: training failed ({status}); see {run_dir}/logs")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_s = statistics.median(r["step_time_s"] for r in records[steps // 5 :])
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "median_step_s": step_s}


def _direct_costs(root: Path) -> dict[str, float]:
    from llmctl.config import compose
    from llmctl.train.watchdog import Watchdog

    cfg = compose("tiny_cpu", [f"train.run_dir={root / 'direct'}"])
    (root / "direct" / "logs").mkdir(parents=True)
    wd = Watchdog(cfg, root / "direct", 0, 1, None)  # not started: its calls, timed alone
    n = 200_000
    t0 = time.process_time()
    for i in range(n):
        wd.beat(i, 1.0, 0.1)
    beat_s = (time.process_time() - t0) / n
    (root / "direct" / "logs" / "heartbeats").mkdir()
    m = 2000
    t0 = time.process_time()
    for _ in range(m):
        wd._write_heartbeat()
    return {"beat_s": beat_s, "heartbeat_s": (time.process_time() - t0) / m,
            "heartbeat_interval_s": wd.interval_s}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rep in range(args.reps):
            order = ("off", "on") if rep % 2 == 0 else ("on", "off")
            for side in order:
                r = _run(root, f"{side}{rep}", args.steps, side == "on")
                runs[side].append(r)
                print(f"rep {rep} {side:3s} cpu {r['cpu_s']:6.2f} s  median step "
                      f"{r['median_step_s'] * 1e3:6.1f} ms", flush=True)  # fmt: skip
        direct = _direct_costs(root)
    off_cpu = statistics.median(r["cpu_s"] for r in runs["off"])
    on_cpu = statistics.median(r["cpu_s"] for r in runs["on"])
    off_step = statistics.median(r["median_step_s"] for r in runs["off"])
    on_step = statistics.median(r["median_step_s"] for r in runs["on"])
    per_step = (
        2 * direct["beat_s"] + direct["heartbeat_s"] * off_step / direct["heartbeat_interval_s"]
    )
    summary = {
        "steps": args.steps,
        "reps": args.reps,
        "load_average": os.getloadavg(),
        "cpu_s": {"off": off_cpu, "on": on_cpu, "ratio": on_cpu / off_cpu},
        "median_step_s": {"off": off_step, "on": on_step, "ratio": on_step / off_step},
        "direct": direct | {"watchdog_s_per_step": per_step, "fraction": per_step / off_step},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
