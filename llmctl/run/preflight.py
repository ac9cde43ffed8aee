"""Checks a launcher runs before starting any training process (no torch import).

Everything a user can get wrong and fix is checked here and raised as a one-line `UserError`:
a layout the world size cannot hold, a GPU-only precision on a CPU cluster, a missing or
unreadable data prefix, a tokenizer larger than the model's vocabulary, an object store
(`checkpoint.dir=s3://...`) that refuses the credentials or has no such bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmctl.errors import UserError
from llmctl.plan.layout import Layout
from llmctl.run.data import DataSpec, resolve_data
from llmctl.run.layout import resolve_layout
from llmctl.run.planning import loss_balanced_stage_layers
from llmctl.run.precision import PrecisionRecipe, check_precision

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig


@dataclass(frozen=True, slots=True)
class Preflight:
    """What the checks resolved."""

    layout: Layout
    precision: PrecisionRecipe
    data: DataSpec


def preflight(
    cfg: RootConfig,
    world_size: int | None = None,
    planned: Layout | None = None,
    *,
    data: DataSpec | None = None,
) -> Preflight:
    """Check a run before launch; builds the demo corpus if the data config asks for it.

    Args:
        cfg: The resolved `RootConfig`.
        world_size: Number of ranks that will be launched (None = from the layout).
        planned: The plan's chosen layout, if any.
        data: The data as already checked (`llmctl train` checks explicit data.prefixes once,
            when it prepares the launch); None = check it here (and build the demo corpus).

    Raises:
        UserError: On the first problem found.
    """
    layout = resolve_layout(cfg, world_size, planned)
    on_gpu = str(cfg.cluster.device) == "cuda"
    _check_moe(cfg, layout, on_gpu)
    recipe = check_precision(cfg.precision, has_cuda=on_gpu, has_te=on_gpu)
    loss_balanced_stage_layers(cfg, layout)  # the planner's split must be buildable
    if cfg.checkpoint.dir is not None:  # wrong credentials, no bucket: before any rank starts
        from llmctl.run.storage_s3 import check_reachable

        check_reachable(str(cfg.checkpoint.dir))
    return Preflight(layout=layout, precision=recipe, data=data or resolve_data(cfg))


def _check_moe(cfg: RootConfig, layout: Layout, on_gpu: bool) -> None:
    """MoE settings megatron-core refuses only after launch: the all-to-all overlap needs CUDA
    streams; its MoELayer refuses to train with TP > 1 without sequence parallelism (which
    llmctl's CPU layer does not run)."""
    if layout.moe_a2a_overlap and not on_gpu:
        raise UserError(
            "parallel.moe_a2a_overlap=true needs CUDA: megatron-core overlaps the MoE "
            "all-to-alls on CUDA streams; set parallel.moe_a2a_overlap=false on a CPU cluster"
        )
    if cfg.model.num_experts and layout.tp > 1 and not layout.sequence_parallel:
        fix = "set parallel.sequence_parallel=true" if on_gpu else "use parallel.tp=1 on CPU"
        raise UserError(
            f"parallel.tp={layout.tp} with a MoE model needs sequence parallelism (megatron-core's "
            f"MoELayer refuses to train without it): {fix}"
        )
