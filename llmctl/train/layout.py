"""The concrete parallel layout a training run uses, resolved from config, plan and world size.

Pure Python (no torch): the launcher calls `resolve_layout` before starting any process, so a
layout the world size cannot hold is a one-line `UserError` naming the failing product.
Precedence per field: explicit `cfg.parallel` value, then the plan's chosen layout, then the
smallest valid default (1; DP fills the rest of the world).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmctl.errors import UserError


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

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "ep", "dp", "micro_batch_size", "global_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
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
        sequence_parallel=bool(_pick(p.sequence_parallel, planned, "sequence_parallel", False)),
        recompute=_enum_value(_pick(p.recompute, planned, "recompute", "none")),
        optimizer_sharding=_enum_value(
            _pick(p.optimizer_sharding, planned, "optimizer_sharding", "none")
        ),
    )
    check_layout_fits_model(layout, cfg.model)
    return layout


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
