"""The concrete parallel layout a training run uses, resolved from config, plan and world size.

Pure Python (no torch): the launcher calls `resolve_layout` before starting any process, so a
layout the world size cannot hold is a one-line `UserError` naming the failing product.
Precedence per field: explicit `cfg.parallel` value, then the plan's chosen layout, then the
smallest valid default (1; DP fills the rest of the world).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

# Optimizer shardings llmctl.train implements (train/optim.py refuses FSDP, "full").
RUNNER_SHARDINGS = ("none", "distributed")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainLayout:
    """Parallel degrees and batch split of one run. Validated at construction."""

    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    sequence_parallel: bool
    recompute: str
    optimizer_sharding: str
    moe_a2a_overlap: bool = False
    """megatron-core `overlap_moe_expert_parallel_comm` (`parallel.moe_a2a_overlap`)."""
    etp: int | None = None
    """megatron-core `expert_tensor_parallel_size` (`parallel.etp`); None = TP."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "ep", "dp", "micro_batch_size", "global_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.etp is not None and self.etp < 1:
            raise UserError(f"parallel.etp must be >= 1 or null, got {self.etp}")
        if self.vpp is not None and self.vpp < 1:
            raise UserError(f"parallel.vpp must be >= 1 or null, got {self.vpp}")
        per_step = self.micro_batch_size * self.dp
        if self.global_batch_size % per_step:
            raise UserError(
                f"train.global_batch_size={self.global_batch_size} not divisible by "
                f"micro_batch_size*dp = {self.micro_batch_size}*{self.dp}"
            )

    @property
    def world_size(self) -> int:
        """Number of ranks: TP*PP*CP*DP (EP folds into DP in megatron's layout)."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel rank (gradient accumulation)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def interleaved(self) -> bool:
        """Whether the interleaved (virtual pipeline) schedule runs."""
        return self.pp > 1 and self.vpp is not None and self.vpp > 1

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (plan.json, perf.json, metrics)."""
        return asdict(self)


def _pick(explicit: Any, planned: dict[str, Any], key: str, default: Any) -> Any:
    if explicit is not None:
        return explicit
    value = planned.get(key)
    return default if value is None else value


def _enum_value(value: Any) -> str:
    return str(getattr(value, "value", value))


def resolve_layout(
    cfg: Any, world_size: int | None = None, planned: dict[str, Any] | None = None
) -> TrainLayout:
    """Resolve the layout of a run and check it against the model and world size.

    Args:
        cfg: The resolved `RootConfig`.
        world_size: Number of ranks launched; None = derive it from the layout (DP defaults 1).
        planned: The plan's chosen layout (keys tp, pp, vpp, cp, ep, dp, micro_batch_size, ...).

    Returns:
        The validated layout.

    Raises:
        UserError: If the degrees do not multiply to the world size or do not divide the model.
    """
    p, planned = cfg.parallel, planned or {}
    tp = int(_pick(p.tp, planned, "tp", 1))
    pp = int(_pick(p.pp, planned, "pp", 1))
    cp = int(_pick(p.cp, planned, "cp", 1))
    vpp = _pick(p.vpp, planned, "vpp", None)
    model_parallel = tp * pp * cp
    dp_default = 1 if world_size is None else max(world_size // model_parallel, 1)
    dp = int(_pick(p.dp, planned, "dp", dp_default))
    if world_size is not None and tp * pp * cp * dp != world_size:
        raise UserError(
            f"world size {world_size} != TP*PP*CP*DP = {tp}*{pp}*{cp}*{dp}; "
            "change parallel.* or the number of processes"
        )
    layout = TrainLayout(
        tp=tp,
        pp=pp,
        vpp=None if vpp in (None, 1) else int(vpp),
        cp=cp,
        ep=int(_pick(p.ep, planned, "ep", 1)),
        dp=dp,
        micro_batch_size=int(_pick(p.micro_batch_size, planned, "micro_batch_size", 1)),
        global_batch_size=int(cfg.train.global_batch_size),
        sequence_parallel=_sequence_parallel(cfg, planned, tp),
        recompute=_enum_value(_pick(p.recompute, planned, "recompute", "none")),
        optimizer_sharding=_enum_value(
            _pick(p.optimizer_sharding, planned, "optimizer_sharding", "none")
        ),
        moe_a2a_overlap=bool(p.moe_a2a_overlap),
        etp=_optional_int(_pick(p.etp, planned, "etp", None)),
    )
    check_layout_fits_model(layout, cfg.model)
    check_moe_overlap(layout)
    return layout


def check_moe_overlap(layout: TrainLayout) -> None:
    """Refuse, before launch, a layout megatron-core refuses `overlap_moe_expert_parallel_comm`
    for (the planner's `moe.overlap_refusal`, the same rules as its TransformerConfig).

    Raises:
        UserError: naming the layout field to change.
    """
    if not layout.moe_a2a_overlap:
        return
    from llmctl.plan import Layout, Recompute
    from llmctl.plan.moe import overlap_refusal

    why = overlap_refusal(
        Layout(
            tp=layout.tp,
            pp=layout.pp,
            vpp=layout.vpp or 1,
            cp=layout.cp,
            ep=layout.ep,
            dp=layout.dp,
            recompute=Recompute(layout.recompute),
        )
    )
    if why:
        raise UserError(
            f"parallel.{why} (megatron-core); change the layout or set "
            "parallel.moe_a2a_overlap=false"
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _sequence_parallel(cfg: Any, planned: dict[str, Any], tp: int) -> bool:
    """Sequence parallelism: the config's, else the plan's; always off on CPU clusters.

    Raises:
        UserError: `parallel.sequence_parallel=true` with TP > 1 on a CPU cluster.
    """
    explicit = cfg.parallel.sequence_parallel
    if str(cfg.cluster.device) != "cpu" or (explicit and tp == 1):
        return bool(_pick(explicit, planned, "sequence_parallel", False))
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


def runner_shardings(cfg: Any) -> tuple[str, ...]:
    """Optimizer shardings the plan may choose for a training run.

    On CPU (megatron-core's torch-Adam path) a distributed-optimizer checkpoint does not
    reload, so with checkpointing on only "none" is searched, and an explicit "distributed"
    is refused here rather than by every rank at start.

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
        return ("none",) if cpu_checkpoints else RUNNER_SHARDINGS
    if cpu_checkpoints and str(asked) == "distributed":
        raise UserError(
            "parallel.optimizer_sharding=distributed cannot be checkpointed on CPU "
            "(megatron-core's torch-Adam path does not reload it); use "
            "parallel.optimizer_sharding=none or checkpoint.interval=0"
        )
    return (str(asked),)


def check_layout_fits_model(layout: TrainLayout, model: Any) -> None:
    """Check that the degrees divide the model's dimensions.

    Raises:
        UserError: Naming the dimension and the degree that does not divide it.
    """
    checks = [
        ("model.num_attention_heads", model.num_attention_heads, "TP", layout.tp),
        ("model.num_query_groups", model.num_query_groups, "TP", layout.tp),
        ("model.ffn_hidden_size", model.ffn_hidden_size, "TP", layout.tp),
        ("model.vocab_size", model.vocab_size, "TP", layout.tp),
        ("model.num_layers", model.num_layers, "PP*VPP", layout.pp * (layout.vpp or 1)),
        ("model.seq_length", model.seq_length, "2*CP", 2 * layout.cp if layout.cp > 1 else 1),
    ]
    for field, value, what, degree in checks:
        if value % degree:
            raise UserError(f"{field}={value} not divisible by {what}={degree}")
    if layout.vpp is not None and layout.pp == 1:
        raise UserError("parallel.vpp needs parallel.pp > 1 (virtual stages interleave a pipeline)")
    if layout.interleaved and layout.num_microbatches % layout.pp:
        raise UserError(
            f"interleaved pipeline needs micro-batches per step ({layout.num_microbatches}) "
            f"divisible by PP={layout.pp}; change train.global_batch_size"
        )
    if layout.sequence_parallel and layout.tp == 1:
        raise UserError("parallel.sequence_parallel needs parallel.tp > 1")
