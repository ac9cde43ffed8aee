"""Speed stays: CPU time (not wall: the test machine is shared) of the 405B/1024-GPU search.

The bounds (1 s, 2 s) hold on the 2-core reference host, whose `_host_unit()` is ~0.04 s; a
slower CPU (another family, a lower clock, SMT siblings busy) scales them by its own unit,
measured in the same process: the search is ~20 units here (19.2-20.3 measured), the bound 25.
"""

from __future__ import annotations

import math
import resource
import subprocess
import sys
import time

from llmctl.config import compose
from llmctl.plan import flops, memory, params, perf, plan, search
from llmctl.run.planning import plan_input

RECIPE = "llama31_405b_pretrain_1024gpu_h100_fp8"


def _clear_caches() -> None:
    for fn in (
        params.layer_params,
        params.embedding_params,
        params.output_params,
        flops.token_flops,
        memory.layer_activation_bytes,
        memory._activation_bytes,
        perf._slot_cached,
        perf.layer_gemm_s,
        perf._logits_s,
        perf._tp_comm_s,
        perf.column_bwd_gemm_s,
        search._split,
    ):
        fn.cache_clear()


REFERENCE_UNIT_S = 0.04  # _host_unit() on the 2-core CI reference host


def _host_unit() -> float:
    """CPU seconds of a fixed pure-Python loop (dict updates, float math: what the search
    does), best of 3: the host's speed, measured beside the search."""
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        acc: dict[int, float] = {}
        for i in range(400_000):
            acc[i % 997] = acc.get(i % 997, 0.0) + math.sqrt(i) * 1.0001
        best = min(best, time.process_time() - t)
    return best


def _scale() -> float:
    """1 on hosts at least as fast as the reference, else how much slower this one is."""
    return max(1.0, _host_unit() / REFERENCE_UNIT_S)


def test_405b_on_1024_gpus_searches_in_under_1s_cpu() -> None:
    inp = plan_input(compose(RECIPE, []))
    # The search and the host unit alternate, and the least slowed-down round counts: on a
    # loaded host a busy spell can hit the search and miss the unit measured beside it.
    rounds = []
    for _ in range(3):
        _clear_caches()
        t = time.process_time()
        res = plan(inp)
        spent = time.process_time() - t
        rounds.append((spent / max(1.0, _host_unit() / REFERENCE_UNIT_S), spent))
    assert res.num_candidates > 10_000
    scaled, spent = min(rounds)
    assert scaled < 1.0, f"{spent:.3f} s CPU, {scaled:.3f} s at the reference host's speed"


def test_plan_json_process_under_2s_cpu() -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = "from llmctl.cli.main import app; app()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "plan", f"recipe={RECIPE}", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 2.0 * _scale(), f"{cpu:.3f} s CPU"
