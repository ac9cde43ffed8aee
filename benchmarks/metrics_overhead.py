"""What Prometheus metrics cost a training run: the tiny CPU run with `train.metrics` off and on.

Run: `python benchmarks/metrics_overhead.py [--steps 150] [--reps 3]`.

Side by side, alternated (off, on, on, off, off, on, ...) in fresh one-rank processes
(`python -m llmctl.train.entry RUN_DIR`, recipe tiny_cpu, OMP_NUM_THREADS=1) so machine load
drifts hit both alike. "On" serves /metrics, is scraped every second by a client thread of this
script (15 times Prometheus' default rate) and pushes every second to a real Pushgateway when
scripts/prometheus_local.sh has installed one. Per run: the process's CPU seconds (user + sys,
from wait4; whole run, and the steps after the first fifth: the total less /proc's count when
that step is logged, every thread of the process included), the training thread's own CPU
seconds over those steps (schedstat, `rank_cpu` of metrics.jsonl) and the median step time.
Then, in this process, the two costs the metrics add, measured directly: the training
thread's update per step (`RankExporter.step`) and the CPU time of one scrape (`generate_latest`
of a rank's registry), each against the median "off" step time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))


def _run(root: Path, name: str, steps: int, port: int | None, gateway: str | None) -> dict:
    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir

    run_dir = root / name
    overrides = [f"train.train_iters={steps}", "train.eval_interval=0", f"train.run_dir={run_dir}"]
    overrides.append(f"data.cache_dir={root / 'cache'}")
    if port:
        overrides += [f"train.metrics.port={port}", "train.metrics.push_interval_s=1"]
        overrides += [f"train.metrics.pushgateway={gateway}"] if gateway else []
    create_run_dir(compose("tiny_cpu", overrides), None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LLMCTL_WANDB": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmctl.train.entry", str(run_dir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stop, scrapes = threading.Event(), [0]
    if port:
        threading.Thread(target=_scrape, args=(port, stop, scrapes), daemon=True).start()
    warm = _cpu_at_step(proc.pid, run_dir / "metrics.jsonl", steps // 5)
    _, status, usage = os.wait4(proc.pid, 0)
    stop.set()
    assert os.waitstatus_to_exitcode(status) == 0, f"{name} failed"
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = records[steps // 5 :]
    total = usage.ru_utime + usage.ru_stime
    return {
        "cpu_s": total,
        "loop_cpu_s": total - warm,
        "thread_cpu_s": sum(r["rank_cpu"][0][0] for r in steady if r.get("rank_cpu")),
        "median_step_s": statistics.median(r["step_time_s"] for r in steady),
        "scrapes": scrapes[0],
    }


def _cpu_at_step(pid: int, metrics: Path, step: int) -> float:
    """The process's CPU seconds (all threads; /proc, 10 ms ticks) when `step` is logged."""
    while True:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= step:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        time.sleep(0.02)


def _scrape(port: int, stop: threading.Event, count: list[int]) -> None:
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
            count[0] += 1
        except OSError:
            pass  # not serving yet (start-up) or already closed


def _direct_costs(root: Path) -> dict[str, float]:
    """Training-thread CPU per step update and CPU per scrape of a real exporter."""
    from llmctl.config import compose
    from llmctl.run.layout import resolve_layout
    from llmctl.run.prom import RankExporter

    cfg = compose("tiny_cpu", [f"train.run_dir={root}"])
    plan = {"step_time_s": 0.05, "mfu": 0.2, "tokens_per_s": 1e4, "peak_mem_gib": 0.3}
    ex = RankExporter(
        cfg, root, resolve_layout(cfg, 1, None), rank=0, on_gpu=False, plan=plan, ckpt=None
    )
    t0 = time.thread_time()
    n = 20000
    for step in range(n):
        ex.step(step, 3.0, 1.0, 1e-3, 0.07, rank_cpu=[[0.06, 0.0, 1.0]])
    update_s = (time.thread_time() - t0) / n
    t0 = time.thread_time()
    for _ in range(500):
        ex.m.exposition()
    return {"update_s": update_s, "scrape_s": (time.thread_time() - t0) / 500}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from prom_support import find_binary, free_ports, pushgateway

    from llmctl.data.demo import prepare_demo_data

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        prepare_demo_data(root / "cache")  # built once, before anything is timed
        gateway_port, port = free_ports(2)
        gateway = None
        if find_binary("prometheus-pushgateway"):
            gateway = stack.enter_context(pushgateway(root, gateway_port))
        results: dict[str, list[dict]] = {"off": [], "on": []}
        for rep in range(args.reps):  # off, on, on, off, off, on, ...: no side always first
            for side in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                on = side == "on"
                name, p, g = f"{side}{rep}", port if on else None, gateway if on else None
                results[side].append(_run(root, name, args.steps, p, g))
        direct = _direct_costs(root)
    _report(results, direct, args.steps, gateway is not None)


def _report(results: dict, direct: dict, steps: int, pushed: bool) -> None:
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    step_s = med["off"]["median_step_s"]
    print(f"tiny_cpu, {steps} steps, one rank, OMP_NUM_THREADS=1, {len(results['on'])} pairs")
    print(f"(on: served, scraped every 1 s, {'pushed every 1 s' if pushed else 'no push'})")
    print("| metrics | process CPU s, whole run | process CPU s, steps after warm-up "
          "| training thread CPU s, same steps | median step s | scrapes |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for k in ("off", "on"):
        each = {m: ", ".join(f"{r[m]:.2f}" for r in results[k]) for m in results[k][0]}
        cells = [f"{med[k][m]:.2f} ({each[m]})" for m in ("cpu_s", "loop_cpu_s", "thread_cpu_s")]
        print(f"| {k} | {' | '.join(cells)} | {med[k]['median_step_s']:.4f} |"
              f" {med[k]['scrapes']:.0f} |")  # fmt: skip
    for m, what in (("loop_cpu_s", "process, steps"), ("thread_cpu_s", "training thread")):
        extra = med["on"][m] - med["off"][m]
        pairs = [a[m] - b[m] for a, b in zip(results["on"], results["off"], strict=True)]
        print(f"CPU s on - off ({what}): {extra:+.2f} ({extra / med['off'][m]:+.2%}); "
              f"per pair {', '.join(f'{d:+.2f}' for d in pairs)}")  # fmt: skip
    print(f"update per step (training thread): {direct['update_s'] * 1e6:.1f} us "
          f"= {direct['update_s'] / step_s:.3%} of a {step_s * 1e3:.0f} ms step")  # fmt: skip
    print(f"one scrape (exposition, HTTP thread): {direct['scrape_s'] * 1e3:.2f} ms CPU "
          f"= {direct['scrape_s'] / 1.0:.3%} of each second at a 1 s scrape interval")  # fmt: skip


if __name__ == "__main__":
    main()
