"""The elastic question: the best layout on N nodes that a checkpoint can be resharded to.

Why here: the elastic re-plan (host lost, host back, a SLURM job granted fewer nodes) asks the
planner one thing, and a caller with only a checkpoint and a node count (`llmctl plan --nodes
N --from-checkpoint CKPT`) asks the same. megatron-core's distributed checkpoints reshard the
model and optimizer state across TP, PP, VPP, CP, EP and DP on load, but not across the
optimizer sharding (a distributed-optimizer or FSDP state is not converted; see
`llmctl.run.ckpt_compat`), and the model shape is the checkpoint's. So the question is the
ordinary search on the resized cluster with the sharding pinned, the global batch kept
(`launcher.elastic_batch=keep_global`) and every other layout dimension free unless the
caller fixes it.

Pure and fast: one `plan()` call with the sharding pinned (a third of the sharding variants
of each layout), no suggestions; 405B on 1024 GPUs searches in well under a second of CPU
(tests/unit/plan/test_plan_reshard.py).
"""

from __future__ import annotations

from dataclasses import replace

from llmctl.plan.search import PlanResult, plan
from llmctl.plan.specs import Constraints, PlanInput, Sharding


def reshard_input(
    inp: PlanInput, num_nodes: int, sharding: Sharding, fixed: Constraints | None = None
) -> PlanInput:
    """`inp` on `num_nodes` nodes of the same kind, the optimizer sharding pinned to the
    checkpoint's, the layout dimensions free except those in `fixed`.

    Raises:
        ValueError: `num_nodes` < 1, or `fixed` pins another optimizer sharding.
    """
    if num_nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {num_nodes}")
    keep = fixed or Constraints()
    if keep.optimizer_sharding is not None and keep.optimizer_sharding != sharding:
        raise ValueError(
            f"the checkpoint's optimizer sharding is {sharding}; its state cannot be converted "
            f"to {keep.optimizer_sharding}"
        )
    constraints = replace(
        keep,
        optimizer_sharding=sharding,
        allow_tp_outside_nvlink=inp.constraints.allow_tp_outside_nvlink,
    )
    cluster = replace(inp.cluster, num_nodes=num_nodes)
    return replace(inp, cluster=cluster, constraints=constraints)


def reshard_plan(
    inp: PlanInput, num_nodes: int, sharding: Sharding, fixed: Constraints | None = None
) -> PlanResult:
    """The ranked layouts on `num_nodes` nodes the checkpoint can load into
    (`reshard_input`); `best` is the answer, None when nothing fits (see `rejections`).

    Raises:
        ValueError: as `reshard_input`, or impossible fixed dimensions.
    """
    return plan(reshard_input(inp, num_nodes, sharding, fixed), suggest=False)
