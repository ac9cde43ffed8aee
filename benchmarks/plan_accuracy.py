"""Planner accuracy against published measured runs, and where the published layouts rank.

Usage: python benchmarks/plan_accuracy.py [--json]
Rows: tests/fixtures/plan/published_runs.json (Korthikanti et al. 2022 Table 5 on A100 BF16;
NeMo 24.07 and Megatron-Bridge performance tables on H100 FP8, Bridge's Qwen3 MoE rows), each
with its source line. Prints the predicted and measured step time of every row (fit and MoE
rows marked), the mean and worst |error| of the dense fit, dense held-out and MoE (all held
out) rows, and the rank of each recipe's published layout among the fitting layouts of a
full search. docs/planner.md quotes this output.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

from llmctl.config import compose
from llmctl.plan import ClusterSpec, evaluate
from llmctl.plan.reference import layer_row_s, measured_step_s, row_input, row_layout
from llmctl.run.planning import cluster_spec, plan_config

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "plan" / "published_runs.json"
RECIPES = [
    "llama3_8b_pretrain_8gpu_h100_fp8",
    "llama3_70b_pretrain_64gpu_h100_fp8",
    "llama31_405b_pretrain_1024gpu_h100_fp8",
    "megatron_22b_pretrain_8gpu_a100_bf16",
    "gpt3_175b_pretrain_64gpu_a100_bf16",
    "megatron_530b_pretrain_280gpu_a100_bf16",
    "megatron_1t_pretrain_512gpu_a100_bf16",
]


@cache
def _cluster(name: str) -> ClusterSpec:
    return cluster_spec(compose("megatron_22b_pretrain_8gpu_a100_bf16", [f"cluster={name}"]))


def rows() -> list[dict[str, Any]]:
    """Every published row with its predicted and measured step time."""
    data = json.loads(FIX.read_text())
    out = []
    for row in data["rows"]:
        inp = row_input(row, data["models"], _cluster(row["cluster"]))
        ev = evaluate(inp, row_layout(row))
        measured = measured_step_s(row, inp.model)
        out.append(
            {
                "id": row["id"],
                "fit": row["fit"],
                "moe": row.get("moe", False),
                "excluded": bool(row.get("moe_excluded")),
                "layout": ev.layout.short(),
                "measured_s": measured,
                "predicted_s": ev.rates.step_s,
                "error": ev.rates.step_s / measured - 1.0,
                "peak_gib": ev.memory.total_gib,
                "fits": ev.fits,
            }
        )
    return out


def table4() -> list[dict[str, Any]]:
    """Per-layer times of Korthikanti et al. 2022 Table 4 (22B, TP8) against the model."""
    data = json.loads(FIX.read_text())
    table = json.loads(FIX.with_name("korthikanti_2022.json").read_text())["table4"]
    cluster = _cluster("dgx_a100_80gb")
    out = []
    for row in table["rows"]:
        pred, meas = layer_row_s(table, row, data["models"]["gpt_22b"], cluster)
        out.append({"row": row["name"], "measured_ms": meas * 1e3, "predicted_ms": pred * 1e3})
    base = out[0]["predicted_ms"]
    for r in out:
        r["error"] = r["predicted_ms"] / r["measured_ms"] - 1.0
        r["vs_no_recompute"] = r["predicted_ms"] / base - 1.0
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean and worst |error| of the dense fit rows, dense held-out rows, all dense rows, the
    (held-out) mixture-of-experts rows and, apart, the MoE rows flagged excluded."""
    groups = {
        "fit": lambda r: r["fit"] and not r["moe"],
        "held_out": lambda r: not r["fit"] and not r["moe"],
        "all_dense": lambda r: not r["moe"],
        "moe_held_out": lambda r: r["moe"] and not r["excluded"],
        "moe_excluded": lambda r: r["excluded"],
    }
    out = {}
    for label, keep in groups.items():
        errs = [abs(r["error"]) for r in table if keep(r)]
        if errs:
            mean = sum(errs) / len(errs)
            out[label] = {"rows": len(errs), "mean_abs": mean, "max_abs": max(errs)}
    return out


def ranks() -> list[dict[str, Any]]:
    """Rank of each recipe's published layout among its fitting layouts."""
    out = []
    for recipe in RECIPES:
        res = plan_config(compose(recipe, []))
        ref, best = res.reference, res.best
        assert ref is not None and best is not None
        out.append(
            {
                "recipe": recipe,
                "published": ref.layout.short(),
                "rank": res.reference_rank,
                "fitting": sum(1 for p in res.points if p[2]),
                "top_pick": best.layout.short(),
                "top_pick_margin": 1.0 - best.rates.step_s / ref.rates.step_s,
            }
        )
    return out


def main() -> None:
    table, rank_rows, layers = rows(), ranks(), table4()
    stats = summary(table)
    if "--json" in sys.argv:
        out = {"rows": table, "summary": stats, "ranks": rank_rows, "table4": layers}
        print(json.dumps(out, indent=1))
        return
    print("| published run | fit? | layout | measured s | predicted s | error | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(
            f"| {r['id']} | {'fit' if r['fit'] else 'held out'}{' (MoE)' if r['moe'] else ''}"
            f"{', excluded' if r['excluded'] else ''} | "
            f"{r['layout']} | "
            f"{r['measured_s']:.3f} | {r['predicted_s']:.3f} | {r['error']:+.1%} | "
            f"{r['peak_gib']:.1f}{'' if r['fits'] else ' (over)'} |"
        )
    print()
    for label, s in stats.items():
        print(
            f"{label}: {s['rows']:.0f} rows, mean |error| {s['mean_abs']:.1%}, "
            f"worst {s['max_abs']:.1%}"
        )
    print()
    print(
        "| Korthikanti Table 4, 22B layer (A100 fit) | measured ms | predicted ms | error | "
        "vs no recompute |"
    )
    print("|---|---|---|---|---|")
    for r in layers:
        print(
            f"| {r['row']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.2f} | "
            f"{r['error']:+.1%} | {r['vs_no_recompute']:+.1%} |"
        )
    print()
    print("| recipe | published layout | rank (of fitting) | top pick | top pick faster by |")
    print("|---|---|---|---|---|")
    for r in rank_rows:
        print(
            f"| {r['recipe']} | {r['published']} | {r['rank']} of {r['fitting']} | "
            f"{r['top_pick']} | {r['top_pick_margin']:.1%} |"
        )


if __name__ == "__main__":
    main()
