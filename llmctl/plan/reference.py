"""Published training runs as planner inputs (tests/fixtures/plan/published_runs.json).

Why in the library: the accuracy tests, `make bench-plan` and the fitting script must build
exactly the same inputs from a published row, so the conversion lives in one pure place.
Rows carry the model name, layout, batch, numerics and the measured throughput or step time;
`models` carries the shapes. Clusters come from the caller (configs/cluster/*.yaml).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmctl.plan.layout import Layout
from llmctl.plan.perf import layer_s
from llmctl.plan.specs import (
    AttentionKernel,
    ClusterSpec,
    ModelSpec,
    PlanInput,
    Recompute,
    RunSpec,
    SearchSpec,
    Sharding,
)


def model_spec(name: str, shape: dict[str, Any]) -> ModelSpec:
    """ModelSpec of a fixture model: `arch` gpt (LayerNorm, biases, GELU, learned positions,
    dropout, tied embeddings), llama (RMSNorm, SwiGLU, RoPE) or nemotron (LayerNorm, squared
    ReLU, RoPE, no biases). Optional: `kv_channels` (head size when not hidden/heads) and, for
    mixture-of-experts models, `experts`, `topk` and `moe_ffn` (one expert's hidden size)."""
    arch = shape["arch"]
    gpt = arch == "gpt"
    return ModelSpec(
        name=name,
        num_layers=shape["layers"],
        hidden_size=shape["hidden"],
        ffn_hidden_size=shape["ffn"],
        num_attention_heads=shape["heads"],
        num_query_groups=shape["groups"],
        kv_channels=shape.get("kv_channels", shape["hidden"] // shape["heads"]),
        vocab_size=shape["vocab"],
        seq_length=shape["seq"],
        gated_mlp=arch == "llama",
        layernorm_bias=arch != "llama",
        add_bias_linear=gpt,
        learned_positions=shape["seq"] if gpt else 0,
        tied_embeddings=gpt,
        dropout=gpt,
        num_experts=shape.get("experts", 0),
        moe_router_topk=shape.get("topk", 1),
        moe_ffn_hidden_size=shape.get("moe_ffn", 0),
    )


def row_layout(row: dict[str, Any]) -> Layout:
    """The published layout of a row."""
    dp = row["gpus"] // (row["tp"] * row["pp"] * row["cp"])
    return Layout(
        tp=row["tp"],
        pp=row["pp"],
        vpp=row["vpp"],
        cp=row["cp"],
        ep=row.get("ep", 1),
        etp=row.get("etp"),
        dp=dp,
        micro_batch_size=row["mbs"],
        sequence_parallel=row["sp"],
        recompute=Recompute(row["recompute"]),
        optimizer_sharding=Sharding(row["sharding"]),
        loss_balanced=row.get("loss_balanced", False) and row["pp"] > 1,
    )


def row_input(
    row: dict[str, Any], models: dict[str, dict[str, Any]], cluster: ClusterSpec
) -> PlanInput:
    """Planner input of a row on `cluster` (resized to the row's GPU count)."""
    model = model_spec(row["model"], models[row["model"]])
    fp8 = row["dtype"] == "fp8"
    run = RunSpec(
        global_batch_size=row["gbs"],
        compute_dtype=row["dtype"],
        params_dtype="bf16",
        grad_dtype=row["grad_dtype"],
        grad_reduce_dtype=row["grad_dtype"],
        fp8=fp8,
        fp8_param_gather=fp8,
        attention=AttentionKernel(row["attention"]),
        moe_a2a_overlap=row.get("moe_a2a_overlap", False),
    )
    nodes = max(1, row["gpus"] // cluster.gpus_per_node)
    sized = replace(cluster, num_nodes=nodes, gpus_per_node=row["gpus"] // nodes)
    return PlanInput(model=model, cluster=sized, run=run, search=SearchSpec(top_k=10))


def measured_step_s(row: dict[str, Any], model: ModelSpec) -> float:
    """The row's measured seconds per step (given, or from tokens/s/GPU)."""
    if "step_s" in row:
        return float(row["step_s"])
    tokens = row["gbs"] * model.seq_length
    return float(tokens / (float(row["tokens_per_s_per_gpu"]) * row["gpus"]))


def layer_row_s(
    table: dict[str, Any], row: dict[str, Any], shape: dict[str, Any], cluster: ClusterSpec
) -> tuple[float, float]:
    """(predicted, measured) seconds of one per-layer row of Korthikanti et al. 2022 Table 4
    (`table` carries the model's TP and micro-batch, `row` SP, recompute and the time)."""
    model = model_spec(table["model"], shape)
    run = RunSpec(
        global_batch_size=table["mbs"],
        compute_dtype="bf16",
        params_dtype="bf16",
        attention=AttentionKernel.unfused,
    )
    layout = Layout(
        tp=table["tp"],
        micro_batch_size=table["mbs"],
        sequence_parallel=row["sp"],
        recompute=Recompute(row["recompute"]),
    )
    return layer_s(model, cluster, run, layout), row["combined_ms"] * 1e-3
