"""The concrete parallel layout a training run uses, resolved from config, plan and world size.

Pure Python (no torch): the launcher calls `resolve_layout` before starting any process, so a
layout the world size cannot hold is a one-line `UserError` naming the failing product.
Precedence per field: explicit `cfg.parallel` value, then the plan's chosen layout, then the
smallest valid default (1; DP fills the rest of the world).

The layout is the planner's `llmctl.plan.Layout` (one class for both); its saved form in
perf.json, a checkpoint's train_state.json and `train --dry-run --json` is `layout_record`,
read back by `layout_from_record`. Imports nothing else from `llmctl.run` (`run.planning`
uses this module, not the reverse).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from llmctl.errors import UserError
from llmctl.plan.layout import Layout
from llmctl.plan.moe import overlap_refusal
from llmctl.plan.specs import Recompute, Sharding

if TYPE_CHECKING:
    from llmctl.config.schema import ModelConfig, RootConfig

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

# Optimizer shardings llmctl.train implements. "full" (FSDP: megatron-core's torch FSDP2
# wrapper) runs when asked for; a search with the sharding unset keeps to the first two.
RUNNER_SHARDINGS = (Sharding.none, Sharding.distributed, Sharding.full)
SEARCHED_SHARDINGS = (Sharding.none, Sharding.distributed)

T = TypeVar("T")


def _pick(explicit: T | None, planned: T | None, default: T) -> T:
    if explicit is not None:
        return explicit
    return default if planned is None else planned


def resolve_layout(
    cfg: RootConfig, world_size: int | None = None, planned: Layout | None = None
) -> Layout:
    """Resolve the layout of a run and check it against the model and world size.

    Args:
        cfg: The resolved config.
        world_size: Number of ranks launched; None = derive it from the layout (DP defaults 1).
        planned: The plan's chosen layout (plan.json `layout`); its ETP is taken as the
            plan's expert TP (`Layout.expert_tp`), as plan.json records it.

    Returns:
        The validated layout (`moe_a2a_overlap` from `parallel.moe_a2a_overlap`).

    Raises:
        UserError: If the degrees do not multiply to the world size or do not divide the model.
    """
    p, plan = cfg.parallel, planned
    tp = _pick(p.tp, plan.tp if plan else None, 1)
    pp = _pick(p.pp, plan.pp if plan else None, 1)
    cp = _pick(p.cp, plan.cp if plan else None, 1)
    model_parallel = tp * pp * cp
    dp_default = 1 if world_size is None else max(world_size // model_parallel, 1)
    dp = _pick(p.dp, plan.dp if plan else None, dp_default)
    if world_size is not None and tp * pp * cp * dp != world_size:
        raise UserError(
            f"world size {world_size} != TP*PP*CP*DP = {tp}*{pp}*{cp}*{dp}; "
            "change parallel.* or the number of processes"
        )
    values: dict[str, Any] = {
        "tp": tp,
        "pp": pp,
        "vpp": _pick(p.vpp, plan.vpp if plan else None, 1),
        "cp": cp,
        "ep": _pick(p.ep, plan.ep if plan else None, 1),
        "dp": dp,
        "micro_batch_size": _pick(p.micro_batch_size, plan.micro_batch_size if plan else None, 1),
        "sequence_parallel": _pick(
            fixed_sequence_parallel(cfg, tp), plan.sequence_parallel if plan else None, False
        ),
        "recompute": Recompute(
            _pick(p.recompute, plan.recompute if plan else None, Recompute.none)
        ),
        "optimizer_sharding": Sharding(
            _pick(p.optimizer_sharding, plan.optimizer_sharding if plan else None, Sharding.none)
        ),
        "moe_a2a_overlap": bool(p.moe_a2a_overlap),
        "etp": _pick(p.etp, plan.expert_tp if plan else None, None),
    }
    _check_degrees(values, cfg.train.global_batch_size)
    _check_fits_model(values, cfg.train.global_batch_size, cfg.model)
    layout = Layout(**values)
    check_moe_overlap(layout)
    return layout


def _check_degrees(values: dict[str, Any], global_batch_size: int) -> None:
    """Each degree >= 1 and the global batch split evenly over micro-batches and DP."""
    degrees = [(n, values[n]) for n in ("tp", "pp", "cp", "ep", "dp", "micro_batch_size")]
    for name, value in [*degrees, ("global_batch_size", global_batch_size)]:
        if value < 1:
            raise UserError(f"parallel.{name} must be >= 1, got {value}")
    if values["etp"] is not None and values["etp"] < 1:
        raise UserError(f"parallel.etp must be >= 1 or null, got {values['etp']}")
    if values["vpp"] < 1:
        raise UserError(f"parallel.vpp must be >= 1 or null, got {values['vpp']}")
    mbs, dp = values["micro_batch_size"], values["dp"]
    if global_batch_size % (mbs * dp):
        raise UserError(
            f"train.global_batch_size={global_batch_size} not divisible by "
            f"micro_batch_size*dp = {mbs}*{dp}"
        )


def _check_fits_model(values: dict[str, Any], global_batch_size: int, model: ModelConfig) -> None:
    """Check that the degrees divide the model's dimensions and the pipeline schedule's needs.

    Raises:
        UserError: Naming the dimension and the degree that does not divide it.
    """
    tp, pp, vpp, cp = values["tp"], values["pp"], values["vpp"], values["cp"]
    checks = [
        ("model.num_attention_heads", model.num_attention_heads, "TP", tp),
        ("model.num_query_groups", model.num_query_groups, "TP", tp),
        ("model.ffn_hidden_size", model.ffn_hidden_size, "TP", tp),
        ("model.vocab_size", model.vocab_size, "TP", tp),
        ("model.num_layers", model.num_layers, "PP*VPP", pp * vpp),
        ("model.seq_length", model.seq_length, "2*CP", 2 * cp if cp > 1 else 1),
    ]
    for field, value, what, degree in checks:
        if value % degree:
            raise UserError(f"{field}={value} not divisible by {what}={degree}")
    if vpp > 1 and pp == 1:
        raise UserError("parallel.vpp needs parallel.pp > 1 (virtual stages interleave a pipeline)")
    microbatches = global_batch_size // (values["micro_batch_size"] * values["dp"])
    if vpp > 1 and microbatches % pp:
        raise UserError(
            f"interleaved pipeline needs micro-batches per step ({microbatches}) "
            f"divisible by PP={pp}; change train.global_batch_size"
        )
    if values["sequence_parallel"] and tp == 1:
        raise UserError("parallel.sequence_parallel needs parallel.tp > 1")


def check_moe_overlap(layout: Layout) -> None:
    """Refuse, before launch, a layout megatron-core refuses `overlap_moe_expert_parallel_comm`
    for (the planner's `moe.overlap_refusal`, the same rules as its TransformerConfig).

    Raises:
        UserError: naming the layout field to change.
    """
    if not layout.moe_a2a_overlap:
        return
    why = overlap_refusal(layout)
    if why:
        raise UserError(
            f"parallel.{why} (megatron-core); change the layout or set "
            "parallel.moe_a2a_overlap=false"
        )


def layout_record(layout: Layout, global_batch_size: int) -> dict[str, int | bool | str | None]:
    """The layout as runs save it (perf.json, train_state.json, `train --dry-run --json`).

    The form earlier versions wrote, kept byte for byte: `vpp` null without interleaving,
    `etp` null when unset (= TP), the run's global batch size alongside.
    """
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp if layout.interleaved else None,
        "cp": layout.cp,
        "ep": layout.ep,
        "dp": layout.dp,
        "micro_batch_size": layout.micro_batch_size,
        "global_batch_size": global_batch_size,
        "sequence_parallel": layout.sequence_parallel,
        "recompute": layout.recompute.value,
        "optimizer_sharding": layout.optimizer_sharding.value,
        "moe_a2a_overlap": layout.moe_a2a_overlap,
        "etp": layout.etp,
    }


def layout_from_record(data: Mapping[str, Any]) -> Layout:
    """The Layout of a saved `layout_record` (any earlier version's: absent optional keys
    take their defaults, `vpp`/`etp` null or 0 = none/TP, sharding `none` when absent).

    Raises:
        KeyError: tp, pp, dp or micro_batch_size missing.
        TypeError, ValueError: a value that is not a valid degree or choice.
    """
    return Layout(
        tp=int(data["tp"]),
        pp=int(data["pp"]),
        vpp=int(data.get("vpp") or 1),
        cp=int(data.get("cp") or 1),
        ep=int(data.get("ep") or 1),
        etp=int(data["etp"]) if data.get("etp") else None,
        dp=int(data["dp"]),
        micro_batch_size=int(data["micro_batch_size"]),
        sequence_parallel=bool(data.get("sequence_parallel")),
        recompute=Recompute(str(data.get("recompute") or "none")),
        optimizer_sharding=Sharding(str(data.get("optimizer_sharding") or "none")),
        moe_a2a_overlap=bool(data.get("moe_a2a_overlap")),
    )


def fixed_sequence_parallel(cfg: RootConfig, tp: int | None) -> bool | None:
    """The config's sequence-parallel choice (None = the plan's): on a CPU cluster off, as
    llmctl's CPU layer runs tensor parallelism without it.

    Args:
        cfg: The resolved config.
        tp: The run's TP, or the config's (None = searched) when planning.

    Raises:
        UserError: `parallel.sequence_parallel=true` with TP unset or > 1 on a CPU cluster.
    """
    explicit = cfg.parallel.sequence_parallel
    if str(cfg.cluster.device) != "cpu" or (explicit and tp == 1):
        return explicit
    if explicit:
        raise UserError(
            "parallel.sequence_parallel=true needs GPUs: llmctl's CPU layer runs tensor "
            "parallelism without it; remove the override (TP still works on CPU)"
        )
    return False


def with_cpu_ranks_for_layout(cfg: RootConfig) -> RootConfig:
    """On a CPU cluster ranks are processes: size `cluster.gpus_per_node` to the layout asked.

    `--dp N` asks for TP*PP*CP*N ranks; `launcher.nproc_per_node` for that many per node;
    otherwise `--tp/--pp/--cp` ask for at least TP*PP*CP ranks (DP 1), so `--tp 2` makes two
    ranks as `--dp 2` does. Returns a copy with the new count, or `cfg` itself when nothing
    changes (always on GPU clusters); `cfg` is never modified.
    """
    if str(cfg.cluster.device) != "cpu":
        return cfg
    p, c = cfg.parallel, cfg.cluster
    model_parallel = (p.tp or 1) * (p.pp or 1) * (p.cp or 1)
    if p.dp is not None:
        world = model_parallel * p.dp
    elif cfg.launcher.nproc_per_node:
        world = int(cfg.launcher.nproc_per_node) * c.num_nodes
    elif (c.gpus_per_node * c.num_nodes) % model_parallel:
        world = model_parallel
    else:
        return cfg
    if world % c.num_nodes:
        return cfg
    return replace(cfg, cluster=replace(c, gpus_per_node=world // c.num_nodes))


def runner_shardings(cfg: RootConfig) -> tuple[Sharding, ...]:
    """Optimizer shardings the plan may choose for a training run.

    On CPU (megatron-core's torch-Adam path) a distributed-optimizer checkpoint does not
    reload, so with checkpointing on only "none" is searched, and an explicit "distributed"
    is refused here rather than by every rank at start. FSDP ("full") runs only when asked
    for.

    Raises:
        UserError: A sharding the runner does not implement, or the CPU case above.
    """
    asked = cfg.parallel.optimizer_sharding
    if asked is not None and str(asked) not in RUNNER_SHARDINGS:
        raise UserError(
            f"parallel.optimizer_sharding={asked} is not supported by llmctl train; use "
            f"{' or '.join(RUNNER_SHARDINGS)}"
        )
    cpu_checkpoints = str(cfg.cluster.device) == "cpu" and cfg.checkpoint.interval > 0
    if asked is None:
        return (Sharding.none,) if cpu_checkpoints else SEARCHED_SHARDINGS
    if cpu_checkpoints and str(asked) == "distributed":
        raise UserError(
            "parallel.optimizer_sharding=distributed cannot be checkpointed on CPU "
            "(megatron-core's torch-Adam path does not reload it); use "
            "parallel.optimizer_sharding=none or checkpoint.interval=0"
        )
    return (Sharding(asked),)
