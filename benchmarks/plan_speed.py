"""Planner speed: full search for Llama-3.1 405B on 1024 H100s, cost per candidate, competitor.

Usage: python benchmarks/plan_speed.py [--repeats 5]
Set LLM_ANALYSIS_PYTHON to an interpreter with `llm-analysis==0.2.2` installed (its own venv:
it pins an old huggingface-hub) to time the competitor's single-layout evaluation in the same
run. llm-analysis evaluates one given layout and has no search, so the comparison is the cost
of evaluating one layout, and what a search over our candidate set would cost with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from dataclasses import replace

from llmctl.config import compose
from llmctl.plan import PlanInput, flops, memory, params, perf, plan, search
from llmctl.run.planning import plan_input

RECIPE = "llama31_405b_pretrain_1024gpu_h100_fp8"
COMPETITOR = """
import time
from llm_analysis.analysis import train
kw = dict(model_name="megatron-lm-175b", gpu_name="a100-sxm-80gb", dtype_name="w16a16e16",
          log_level="ERROR", batch_size_per_gpu=1, global_batch_size=64, seq_len=2048,
          tp_size=8, pp_size=8, sp_size=8, dp_size=1, activation_recomputation=1,
          flash_attn=False, total_num_gpus=64)
train(**kw)
t = time.perf_counter(); n = 200
for _ in range(n):
    train(**kw)
print((time.perf_counter() - t) / n)
"""


def _clear_caches() -> None:
    for fn in (params.layer_params, params.embedding_params, params.output_params,
               flops.token_flops, memory.layer_activation_bytes, perf._slot_cached,
               perf.layer_gemm_s, perf._logits_s, perf._tp_comm_s, perf.column_bwd_gemm_s,
               search._split):  # fmt: skip
        fn.cache_clear()


def time_search(inp: PlanInput, repeats: int) -> tuple[float, int]:
    """Median cold CPU time of a full search (no what-would-fit hints), and #candidates.

    CPU time, not wall: the benchmark machine is shared with other jobs."""
    times, n = [], 0
    for _ in range(repeats):
        _clear_caches()
        t = time.process_time()
        res = plan(inp, suggest=False)
        times.append(time.process_time() - t)
        n = res.num_candidates
    return statistics.median(times), n


def process_cpu() -> dict[str, object]:
    """CPU seconds (user + sys) of the whole `llmctl plan RECIPE --json` process."""
    import resource
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = "from llmctl.cli.main import app; app()"
    subprocess.run([sys.executable, "-c", code, "plan", f"recipe={RECIPE}", "--json"],
                   capture_output=True, check=True)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"case": f"llmctl plan recipe={RECIPE} --json (whole process)", "cpu_seconds": cpu}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    inp = plan_input(compose(RECIPE, []))
    full_s, n = time_search(inp, args.repeats)
    rows = [{"case": f"{RECIPE} full search", "candidates": n, "cpu_seconds": full_s,
             "us_per_candidate": 1e6 * full_s / n}]  # fmt: skip
    for nodes in (4, 16, 64, 128, 256):
        scaled = replace(inp, cluster=replace(inp.cluster, num_nodes=nodes))
        s, k = time_search(scaled, args.repeats)
        rows.append({"case": f"405B on {nodes * 8} GPUs", "candidates": k, "cpu_seconds": s,
                     "us_per_candidate": 1e6 * s / k})  # fmt: skip
    for mbs in ((1,), (1, 2), (1, 2, 4, 8), (1, 2, 4, 8, 16, 32)):
        scaled = replace(inp, search=replace(inp.search, micro_batch_sizes=mbs))
        s, k = time_search(scaled, args.repeats)
        rows.append({"case": f"405B/1024 GPUs, MBS in {list(mbs)}", "candidates": k,
                     "cpu_seconds": s, "us_per_candidate": 1e6 * s / k})  # fmt: skip
    rows.append(process_cpu())
    python = os.environ.get("LLM_ANALYSIS_PYTHON")
    if python:
        out = subprocess.run([python, "-c", COMPETITOR], capture_output=True, text=True,
                             check=True)  # fmt: skip
        per = float(out.stdout.strip().splitlines()[-1])
        rows.append({"case": "llm-analysis 0.2.2: one layout (GPT-175B, TP8 PP8)",
                     "candidates": 1, "seconds": per, "us_per_candidate": 1e6 * per,
                     "search_of_405b_candidates_s": per * n})  # fmt: skip
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
