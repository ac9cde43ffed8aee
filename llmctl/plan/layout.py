"""One parallel layout and how it splits the layers over pipeline stages.

Uneven pipeline splits (what we do when PP does not divide the layers):
1. `L % (pp*vpp) == 0`: every virtual stage gets `L/(pp*vpp)` layers.
2. `(L+2) % (pp*vpp) == 0`: Megatron's `account_for_embedding_in_pipeline_split` and
   `account_for_loss_in_pipeline_split`: the embedding and the loss each count as one layer,
   so the first and the last virtual stage hold one transformer layer fewer (Llama-3.1 405B,
   126 layers, runs PP=8 VPP=8 this way). Always allowed: it is a standard Megatron option.
3. Otherwise, only with `allow_uneven_pp` and no VPP: Megatron's
   `num_layers_in_first_pipeline_stage` / `num_layers_in_last_pipeline_stage`; the middle
   stages hold `ceil(L/pp)` layers each, the first and last share the rest (first <= last).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmctl.plan.specs import Recompute, Sharding


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSplit:
    """Transformer layers held by the first, a middle (the largest) and the last stage."""

    first: int
    middle: int
    last: int
    method: str

    @property
    def bottleneck(self) -> int:
        """Layers of the stage with the most layers."""
        return max(self.first, self.middle, self.last)


def split_layers(num_layers: int, pp: int, vpp: int, allow_uneven: bool) -> StageSplit | None:
    """Layers per physical stage, or None when no rule above applies."""
    chunks = pp * vpp
    if num_layers % chunks == 0:
        n = num_layers // pp
        return StageSplit(first=n, middle=n, last=n, method="even")
    if pp > 1 and (num_layers + 2) % chunks == 0 and (num_layers + 2) // chunks >= 2:
        n = (num_layers + 2) // pp
        return StageSplit(first=n - 1, middle=n, last=n - 1, method="embedding+loss as layers")
    if allow_uneven and vpp == 1 and pp > 2:
        middle = -(-num_layers // pp)
        rest = num_layers - (pp - 2) * middle
        first = rest // 2
        if first >= 1:
            return StageSplit(first=first, middle=middle, last=rest - first, method="uneven")
    if allow_uneven and vpp == 1 and pp == 2:
        return StageSplit(
            first=num_layers // 2,
            middle=num_layers - num_layers // 2,
            last=num_layers - num_layers // 2,
            method="uneven",
        )
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Parallel degrees, micro-batch and memory options of one layout: a planner candidate or
    the layout a run trains with (`llmctl.run.layout.resolve_layout` builds that one).

    Conventions: `vpp` 1 = no interleaving; `etp` None = TP (megatron-core's default; the
    planner leaves it None unless `parallel.etp` fixes it, a run's layout keeps the value it
    was given, which its saved record writes back); `optimizer_sharding` is the config's
    `parallel.optimizer_sharding`. The global batch size is the run's (`RunSpec`,
    `train.global_batch_size`), not the layout's.

    Validated at construction: `Layout.__post_init__` checks each degree; products against a
    world size are checked by `check_world` (the planner's errors name the failing product).
    """

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    micro_batch_size: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.none
    optimizer_sharding: Sharding = Sharding.distributed
    loss_balanced: bool = False
    etp: int | None = None
    """Expert tensor-parallel size (megatron-core `expert_tensor_parallel_size`); None = TP."""
    moe_a2a_overlap: bool = False
    """megatron-core `overlap_moe_expert_parallel_comm` (`parallel.moe_a2a_overlap`); set on
    the layout a run trains with (the planner reads `RunSpec.moe_a2a_overlap`)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.upper()} must be >= 1, got {getattr(self, name)}")
        if self.etp is not None and self.etp < 1:
            raise ValueError(f"ETP must be >= 1 (or unset = TP), got {self.etp}")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"VPP={self.vpp} needs PP > 1")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence parallelism needs TP > 1")

    @property
    def world_size(self) -> int:
        """TP*PP*CP*DP (EP is carved out of DP*CP, as in Megatron)."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def interleaved(self) -> bool:
        """Whether the interleaved (virtual pipeline) schedule runs: VPP > 1 (needs PP > 1)."""
        return self.vpp > 1

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size: `etp`, or TP when unset."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts (megatron-core's expert data-parallel size): the
        TP*CP*DP ranks of a stage over EP*ETP (CP*DP/EP when ETP = TP)."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.expert_tp))

    def num_microbatches(self, global_batch_size: int) -> int:
        """Micro-batches per step on each data-parallel rank (gradient accumulation)."""
        return global_batch_size // (self.micro_batch_size * self.dp)

    def short(self) -> str:
        """Compact one-line name: `TP4 PP8 VPP5 CP1 DP2 MBS1 SP sel dist`."""
        parts = [f"TP{self.tp}", f"PP{self.pp}"]
        if self.vpp > 1:
            parts.append(f"VPP{self.vpp}")
        parts += [f"CP{self.cp}"]
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.expert_tp != self.tp:
            parts.append(f"ETP{self.etp}")
        parts += [f"DP{self.dp}", f"MBS{self.micro_batch_size}"]
        if self.sequence_parallel:
            parts.append("SP")
        parts += [f"rc={self.recompute.value}", f"opt={self.optimizer_sharding.value}"]
        if self.loss_balanced and self.pp > 1:
            parts.append("lossbal")
        return " ".join(parts)

    def as_dict(self) -> dict[str, int | bool | str]:
        """The planner's plain dict (`plan --json`, plan.json `layout`; `layout_from_dict`
        reads it back). The runner's saved form is `llmctl.run.layout.layout_record`."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "vpp": self.vpp,
            "cp": self.cp,
            "ep": self.ep,
            "dp": self.dp,
            "micro_batch_size": self.micro_batch_size,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute.value,
            "optimizer_sharding": self.optimizer_sharding.value,
            "loss_balanced": self.loss_balanced,
            "etp": self.expert_tp,
        }


LAYOUT_DICT_KEYS = (
    "cp", "dp", "ep", "etp", "loss_balanced", "micro_batch_size", "optimizer_sharding", "pp",
    "recompute", "sequence_parallel", "sharding", "tp", "vpp",
)  # fmt: skip
"""Keys `layout_from_dict` accepts: those of `Layout.as_dict`, and `sharding` (the name of
`optimizer_sharding` on the planner's layout before it was shared with the runner)."""


def layout_from_dict(data: Mapping[str, Any]) -> Layout:
    """The Layout of a mapping with `Layout.as_dict` keys; missing keys take the defaults.

    `etp` is the expert TP as `as_dict` writes it: equal to `tp` (or 0, or null) it reads as
    unset (None = TP), so `layout_from_dict(layout.as_dict()) == layout` for the planner's
    layouts.

    Raises:
        KeyError: an unknown key (named in the message).
        ValueError: a bad value (`Layout`'s message, or the enum's).
        TypeError: a value of the wrong type.
    """
    for key in data:
        if key not in LAYOUT_DICT_KEYS:
            raise KeyError(key)
    values = dict(data)
    if "sharding" in values:  # `optimizer_sharding` wins when both are given
        values.setdefault("optimizer_sharding", values.pop("sharding"))
    if "recompute" in values:
        values["recompute"] = Recompute(str(values["recompute"]))
    if "optimizer_sharding" in values:
        values["optimizer_sharding"] = Sharding(str(values["optimizer_sharding"]))
    etp = values.get("etp")
    if isinstance(etp, int) and etp < 0:
        raise ValueError(f"ETP must be >= 1 (or 0 = TP), got {etp}")
    if etp in (0, None, values.get("tp", 1)):
        values["etp"] = None
    return Layout(**values)


def check_world(world: int, tp: int, pp: int, cp: int) -> None:
    """Raise ValueError naming the product when TP*PP*CP does not divide the world."""
    if world % (tp * pp * cp):
        raise ValueError(f"{world} GPUs not divisible by TP*PP*CP = {tp}*{pp}*{cp}")
