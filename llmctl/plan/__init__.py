"""The parallelism planner: pure functions over frozen values (stdlib + math only).

`plan(PlanInput) -> PlanResult` searches every valid layout; `evaluate` scores one layout.
The memory model is in `memory`, FLOP accounting in `flops`, step time in `perf`.
"""

from llmctl.plan.calibrate import PerfRecord, calibrate
from llmctl.plan.layout import Layout, StageSplit, split_layers
from llmctl.plan.memory import MemoryBreakdown
from llmctl.plan.perf import StepTime, Throughput
from llmctl.plan.record import PLAN_RECORD_VERSION, PlanRecord
from llmctl.plan.search import Evaluation, PlanResult, Rejection, evaluate, plan
from llmctl.plan.specs import (
    AttentionKernel,
    ClusterSpec,
    Constraints,
    Efficiency,
    ModelSpec,
    PlanInput,
    Recompute,
    RunSpec,
    SearchSpec,
    Sharding,
)

__all__ = [
    "PLAN_RECORD_VERSION",
    "AttentionKernel",
    "ClusterSpec",
    "Constraints",
    "Efficiency",
    "Evaluation",
    "Layout",
    "MemoryBreakdown",
    "ModelSpec",
    "PerfRecord",
    "PlanInput",
    "PlanRecord",
    "PlanResult",
    "Recompute",
    "Rejection",
    "RunSpec",
    "SearchSpec",
    "Sharding",
    "StageSplit",
    "StepTime",
    "Throughput",
    "calibrate",
    "evaluate",
    "plan",
    "split_layers",
]
