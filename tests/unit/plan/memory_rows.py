"""Planner inputs of the published memory rows (tests/fixtures/plan/memory_peaks.json).
Not a test module."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from llmctl.config import compose
from llmctl.plan import ClusterSpec, Evaluation, Layout, PlanInput, evaluate
from llmctl.plan.reference import row_input, row_layout
from llmctl.run.planning import cluster_spec

FIXTURE = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "plan" / "memory_peaks.json").read_text()
)


@cache
def cluster(name: str) -> ClusterSpec:
    """A cluster file; `h100_96gb` is dgx_h100 with torchtitan's 96 GB H100s."""
    base = "dgx_h100" if name == "h100_96gb" else name
    spec = cluster_spec(compose("megatron_22b_pretrain_8gpu_a100_bf16", [f"cluster={base}"]))
    return replace(spec, hbm_gib=89.4) if name == "h100_96gb" else spec


def row_plan(row: dict[str, Any]) -> tuple[PlanInput, Layout]:
    """The planner input and layout of one memory row."""
    shape = {**FIXTURE["models"][row["model"]], "seq": row["seq"]}
    full = {**row, "attention": "flash", "dtype": "fp8" if row.get("fp8") else row["dtype"]}
    if row.get("stack") == "torchtitan":
        full["dtype"] = "bf16"  # torchao float8 saves bf16 activations (memory.py)
    inp = row_input(full, {row["model"]: shape}, cluster(row["cluster"]))
    native = row.get("stack") == "torchtitan"
    run = inp.run
    if native:  # torchao float8 all-gathers FP8 weights (enable_fsdp_float8_all_gather)
        run = replace(run, torch_native=True, fp8_param_gather=bool(row.get("fp8")))
    return replace(inp, run=run), row_layout(full)


def row_eval(row: dict[str, Any]) -> Evaluation:
    inp, layout = row_plan(row)
    return evaluate(inp, layout)
