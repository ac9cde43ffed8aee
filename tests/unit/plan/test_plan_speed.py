"""Speed stays: CPU time (not wall: the test machine is shared) of the 405B/1024-GPU search."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

from llmctl.config import compose
from llmctl.config.planning import plan_input
from llmctl.plan import flops, memory, params, perf, plan, search

RECIPE = "llama31_405b_pretrain_1024gpu_h100_fp8"


def _clear_caches() -> None:
    for fn in (
        params.layer_params,
        params.embedding_params,
        params.output_params,
        flops.token_flops,
        memory.layer_activation_bytes,
        perf._slot_cached,
        perf.layer_gemm_s,
        perf._logits_s,
        perf._tp_comm_s,
        perf.column_bwd_gemm_s,
        search._split,
    ):
        fn.cache_clear()


def test_405b_on_1024_gpus_searches_in_under_1s_cpu() -> None:
    inp = plan_input(compose(RECIPE, []))
    best = float("inf")
    for _ in range(2):
        _clear_caches()
        t = time.process_time()
        res = plan(inp)
        best = min(best, time.process_time() - t)
    assert res.num_candidates > 10_000
    assert best < 1.0


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
    assert cpu < 2.0
