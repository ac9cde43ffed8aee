"""Planner accuracy against published measurements, side by side with llm-analysis 0.2.2.

Usage: LLM_ANALYSIS_PYTHON=/path/to/venv/bin/python python benchmarks/plan_accuracy.py
Rows: Megatron-Bridge DGX-H100 FP8 table (tokens/s/GPU of the published layout) and
Korthikanti et al. 2022 Table 5 (iteration time of the published layout on A100-80GB), from
tests/fixtures/plan/. llm-analysis ships configs only for the 175B and 530B GPTs among these,
so it is compared there (A100-SXM-80GB, flops_efficiency = our A100 achievable fraction).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from llmctl.config import compose
from llmctl.config.planning import plan_input
from llmctl.plan import AttentionKernel, Layout, Recompute, Sharding, evaluate

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "plan"
COMPETITOR = """
import json, sys
from llm_analysis.analysis import train
a = json.loads(sys.argv[1])
out = train(model_name=a["name"], gpu_name="a100-sxm-80gb", dtype_name="w16a16e16",
            log_level="ERROR", batch_size_per_gpu=a["mbs"], global_batch_size=a["gbs"],
            seq_len=2048, tp_size=a["tp"], pp_size=a["pp"], sp_size=a["tp"], dp_size=1,
            activation_recomputation=1, flash_attn=False, total_num_gpus=a["gpus"],
            flops_efficiency=a["eff"])
print(json.dumps({"step_s": out["latency_per_iter"],
                  "mem_gib": out["(weight+op_state+grad+act)_memory_per_gpu"] / 2**30}))
"""
LLMA_NAMES = {"gpt3_175b": "megatron-lm-175b", "megatron_530b": "megatron-lm-530b"}


def bridge_rows() -> list[str]:
    out = []
    for row in json.loads((FIX / "megatron_bridge_h100_fp8.json").read_text())["rows"]:
        base = plan_input(compose(row["recipe"], []))
        inp = replace(base, run=replace(base.run, global_batch_size=row["gbs"], grad_dtype="bf16"))
        dp = row["num_gpus"] // (row["tp"] * row["pp"] * row["cp"])
        lay = Layout(
            tp=row["tp"],
            pp=row["pp"],
            vpp=row["vpp"],
            cp=row["cp"],
            dp=dp,
            micro_batch_size=row["mbs"],
            sequence_parallel=row["tp"] > 1,
            sharding=Sharding.full if row["fsdp"] else Sharding.distributed,
        )
        ev = evaluate(inp, lay)
        pred, pub = ev.rates.tokens_per_s_per_gpu, row["tokens_per_s_per_gpu"]
        out.append(
            f"| {row['model']} {row['release']} | {lay.short()} | {pub} | {pred:.0f} | "
            f"{pred / pub - 1:+.1%} | {ev.memory.total_gib:.1f} |"
        )
    return out


def korthikanti_rows() -> list[str]:
    python = os.environ.get("LLM_ANALYSIS_PYTHON")
    out = []
    for m in json.loads((FIX / "korthikanti_2022.json").read_text())["models"]:
        base = plan_input(compose(m["recipe"], []))
        inp = replace(base, run=replace(base.run, attention=AttentionKernel.unfused))
        lay = Layout(
            tp=m["tp"],
            pp=m["pp"],
            micro_batch_size=m["mbs"],
            sequence_parallel=True,
            recompute=Recompute.selective,
            sharding=Sharding.none,
        )
        ev = evaluate(inp, lay)
        pub = m["iteration_s_present_work"]
        theirs = "n/a (no model config)"
        if python and m["name"] in LLMA_NAMES:
            args = dict(
                name=LLMA_NAMES[m["name"]],
                mbs=m["mbs"],
                gbs=m["gbs"],
                tp=m["tp"],
                pp=m["pp"],
                gpus=m["num_gpus"],
                eff=inp.cluster.achievable_fraction["bf16"],
            )
            res = subprocess.run(
                [python, "-c", COMPETITOR, json.dumps(args)],
                check=True,
                capture_output=True,
                text=True,
            )
            t = json.loads(res.stdout.strip().splitlines()[-1])
            theirs = f"{t['step_s']:.2f} s ({t['step_s'] / pub - 1:+.1%}), {t['mem_gib']:.1f} GiB"
        out.append(
            f"| {m['name']} | TP{m['tp']} PP{m['pp']} MBS{m['mbs']} | {pub} | "
            f"{ev.rates.step_s:.2f} ({ev.rates.step_s / pub - 1:+.1%}) | "
            f"{ev.memory.total_gib:.1f} | {theirs} |"
        )
    return out


def main() -> None:
    print("| Bridge row | layout | published tok/s/GPU | predicted | error | peak GiB |")
    print("|---|---|---|---|---|---|")
    print("\n".join(bridge_rows()))
    print()
    print(
        "| Korthikanti model | layout | published s/iter | llmctl s/iter (error) | llmctl GiB |"
        " llm-analysis 0.2.2 s/iter (error), GiB |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(korthikanti_rows()))


if __name__ == "__main__":
    main()
