"""Measure this host's CPU for the planner (`cluster=probe`): GEMM rate, memory bandwidth and
the fixed cost of one framework operation, with torch, in a child process, cached.

Why measured, not a datasheet: a CPU rank's step is small GEMMs, element-wise passes over
host memory and per-operation dispatch costs, none of which follows from a clock and a vector
width (local_cpu.yaml's datasheet-like peak put the demo's prediction at 0.45 of its
measurement). The probe times, with the threads one rank gets when it runs alone on the node (every
logical CPU: the local launcher sets `OMP_NUM_THREADS` to cores / ranks per node):

- `gemm_gflops`: fp32 `torch.mm` over a small model's training GEMMs (`GEMMS`, forward and
  both backward orientations), total FLOPs over the sum of each shape's best time;
- `copy_gb_s`: a 64 MiB tensor copy (bytes read + written), best time;
- `op_us`: one small element-wise op under autograd, the dispatch cost every layer pays.

Times are the calling thread's seconds on a CPU (`time.thread_time`; the training step's
load correction also keeps the training thread's CPU seconds), so other processes on a
shared host stretch them little. What they do not remove is a slow phase of the host itself
(a busy SMT sibling on a virtual machine's core, a clock not yet raised): on the 2-core test
host (AMD EPYC, KVM) the per-op cost read 8-12 us instead of 5 us for 0.3-2 s at a time, and
most often in the first second after torch's import. So the probe spins `WARMUP_S` first, then
measures in interleaved rounds (every GEMM shape, the copy, the op loop, again) for at least
`WINDOW_S` and `MIN_ROUNDS` rounds, and keeps each quantity's best: one slow phase then costs
rounds, not the result. The output records the rounds, the window and the share of the
window the hypervisor reported as stolen (`/proc/stat`; null elsewhere).
`torch` runs with the environment as given, so `ATEN_CPU_CAPABILITY` (avx2, avx512, default)
selects the kernels measured, as it does for training. Results are cached in
`$XDG_CACHE_HOME/llmctl/cpu_probe/` (default ~/.cache), one file per CPU model, kernel
capability, thread count and torch version; `LLMCTL_CPU_PROBE_REFRESH=1` measures again.

`python -m llmctl.topology.cpu_probe` prints the measurement as JSON (what `measure_cpu` runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

#: GEMMs (m, n, k) of a small model's training step on CPU (256 tokens, hidden 64-256,
#: vocabulary 4096), each in its forward (m, n, k), data-gradient (m, k, n) and
#: weight-gradient (n, k, m) orientation, as `llmctl.plan.perf` counts them.
GEMMS = ((256, 4096, 64), (256, 256, 64), (256, 64, 256), (1024, 1024, 256))
GEMM_SHAPES = tuple(shape for m, n, k in GEMMS for shape in ((m, n, k), (m, k, n), (n, k, m)))
COPY_BYTES = 64 * 2**20
#: Seconds of the op loop before any measurement, and the interleaved rounds after it.
WARMUP_S = 0.5
WINDOW_S = 2.5
MIN_ROUNDS = 5
MAX_ROUNDS = 400
OP_REPS = 200
#: A cached measurement is reused only with these (`window_s`: measured over the window).
CACHED_KEYS = frozenset({"gemm_gflops", "copy_gb_s", "op_us", "window_s"})
#: Fixed costs of megatron-core's CPU training step in units of the probe's per-op cost
#: (`op_us`): per layer and micro-batch, per micro-batch and virtual stage, per step. Fitted
#: (exact solve) on one-thread runs of the demo model on the 2-core test host (AVX-512,
#: torch 2.13, op_us 3.388), after the GEMM time at the probed rate and the other terms:
#: 2 layers MBS 4, 4 layers MBS 4, 2 layers MBS 2 (GBS 8; load-corrected, the faster of two
#: runs each: 59.8, 82.5, 88.7 ms), scaled by 0.846, the ratio of the demo's median
#: faster-of-two time over later periods (50.6 ms: 49.0-59.8 ms seen) to the fitted period's:
#: that host's speed drifts by +-15 % over minutes, and the three fits ran in a slow one.
#: Another host pays the same operations at its own `op_us`.
LAYER_OPS = 921.0
CHUNK_OPS = 1757.0
STEP_OPS = 2510.0
#: op_us of that host, for the knobs kept from local_cpu.yaml (p2p latency).
REFERENCE_OP_US = 3.388


def _thread_cpu_s() -> float:
    """Seconds the calling thread has been on a CPU (CLOCK_THREAD_CPUTIME_ID: exact, unlike
    schedstat's tick-updated sum)."""
    return time.thread_time()


def _timed(fn: Any) -> float:
    """The calling thread's CPU seconds for one call of `fn`."""
    start = _thread_cpu_s()
    fn()
    return max(_thread_cpu_s() - start, 1e-9)


def _steal_ticks() -> int | None:
    """Ticks the hypervisor took from this machine's CPUs (/proc/stat's `steal`), or None."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(first[8]) if first[0] == "cpu" and len(first) > 8 else None
    except (OSError, ValueError):
        return None


def _measure() -> dict[str, Any]:
    """The measurement itself (imports torch; run in the child process)."""
    start = time.perf_counter()
    import torch

    imported = time.perf_counter()
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    torch.set_num_threads(threads)
    gemms: list[tuple[Any, float]] = []
    for m, n, k in GEMM_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        reps = max(1, int(5e7 // (2 * m * n * k)))

        def mm(a: Any = a, b: Any = b, reps: int = reps) -> None:
            for _ in range(reps):
                torch.mm(a, b)

        gemms.append((mm, 2.0 * m * n * k * reps))
    x = torch.empty(COPY_BYTES // 4)
    y = torch.empty_like(x)
    w = torch.randn(64, requires_grad=True)

    def copy() -> None:
        y.copy_(x)

    def ops() -> None:
        for _ in range(OP_REPS):
            w * 2.0

    warm_end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < warm_end:
        ops()
    for mm, _ in gemms:
        mm()
    copy()
    gemm_best = [float("inf")] * len(gemms)
    copy_best = op_best = float("inf")
    steal0, window0 = _steal_ticks(), time.perf_counter()
    rounds = 0
    while rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or time.perf_counter() - window0 < WINDOW_S):
        for i, (mm, _) in enumerate(gemms):
            gemm_best[i] = min(gemm_best[i], _timed(mm))
        copy_best = min(copy_best, _timed(copy))
        ops()  # the copy left the caches cold: the op loop is timed warm, as a step runs it
        op_best = min(op_best, _timed(ops))
        rounds += 1
    window = time.perf_counter() - window0
    steal1 = _steal_ticks()
    stolen = None
    if steal0 is not None and steal1 is not None:
        ticks = (steal1 - steal0) / os.sysconf("SC_CLK_TCK")  # /proc/stat: Linux only
        stolen = round(ticks / (window * (os.cpu_count() or 1)), 4)
    flops = sum(f for _, f in gemms)
    return {
        "gemm_gflops": round(flops / sum(gemm_best) / 1e9, 3),
        "copy_gb_s": round(2 * COPY_BYTES / copy_best / 1e9, 3),
        "op_us": round(op_best / OP_REPS * 1e6, 3),
        "threads": threads,
        "capability": str(torch.backends.cpu.get_cpu_capability()),
        "torch": str(torch.__version__),
        "rounds": rounds,
        "window_s": round(window, 3),
        "steal_share": stolen,
        "import_s": round(imported - start, 3),
        "probe_s": round(time.perf_counter() - imported, 3),
    }


def cache_path(cpu_model: str, threads: int) -> Path:
    """Cache file of this CPU model, kernel capability, thread count and Python."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    capability = os.environ.get("ATEN_CPU_CAPABILITY") or "default"
    key = f"{cpu_model}-{capability}-t{threads}-py{sys.version_info[0]}{sys.version_info[1]}"
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in key.lower())
    return base / "llmctl" / "cpu_probe" / f"{safe}.json"


def measure_cpu(cpu_model: str, threads: int) -> dict[str, Any]:
    """This host's measurement: cached, or measured now in a child process (torch stays out
    of the caller, e.g. `llmctl train --dry-run`).

    Raises:
        UserError: the child failed (torch missing or broken), with its last line.
    """
    path = cache_path(cpu_model, threads)
    if path.is_file() and os.environ.get("LLMCTL_CPU_PROBE_REFRESH") != "1":
        try:
            cached = json.loads(path.read_text())
            if isinstance(cached, dict) and set(cached) >= CACHED_KEYS:
                return cached
        except ValueError:
            pass  # a torn or foreign file: measure again and replace it
        # a file without `window_s` is the back-to-back probe's (before the window): measured
        # again, since that probe could read the per-op cost 2x in a slow phase of the host
    proc = subprocess.run(
        [sys.executable, "-m", "llmctl.topology.cpu_probe"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"cluster=probe: the CPU probe failed ({last})")
    data: dict[str, Any] = json.loads(proc.stdout)
    data["cpu_model"] = cpu_model
    from llmctl.staging import write_text_whole

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(data, indent=1) + "\n")
    return data


def probed_cpu_fields(measured: dict[str, Any], knobs: dict[str, float]) -> dict[str, Any]:
    """ClusterConfig fields from a measurement: the GEMM rate as the fp32 peak reached
    (fraction 1), the copy bandwidth as memory bandwidth, the fixed costs as the fitted
    operation counts (`LAYER_OPS`, `CHUNK_OPS`, `STEP_OPS`) times this host's per-op cost, and
    the other knobs of local_cpu.yaml (`knobs`; its p2p latency scaled by the per-op cost)."""
    op_us = float(measured["op_us"])
    eff = dict(knobs)
    eff["layer_overhead_us"] = round(LAYER_OPS * op_us, 3)
    eff["chunk_overhead_us"] = round(CHUNK_OPS * op_us, 3)
    eff["step_overhead_s"] = round(STEP_OPS * op_us * 1e-6, 6)
    if "p2p_latency_us" in eff:
        eff["p2p_latency_us"] = round(eff["p2p_latency_us"] * op_us / REFERENCE_OP_US, 3)
    tflops = float(measured["gemm_gflops"]) / 1e3
    return {
        "peak_tflops": {"fp32": round(tflops, 6)},
        "achievable_fraction": {"fp32": 1.0},
        "hbm_bandwidth_gb_s": float(measured["copy_gb_s"]),
        "nvlink_bandwidth_gb_s": float(measured["copy_gb_s"]),
        "efficiency": eff,
    }


if __name__ == "__main__":
    print(json.dumps(_measure()))
