"""The software stack a run uses, and what it changes in the step-time model.

Why a separate choice: the cluster files' knobs were fitted on Megatron-LM / megatron-core with
Transformer Engine (NeMo, Megatron-Bridge). A PyTorch-native stack (torchtitan: DTensor tensor
parallelism, FSDP2, `torch.distributed.pipelining`) runs the same math with different overlap:

- TP collectives beyond the backward's own async ones (`efficiency.tp_overlap`, Transformer
  Engine's userbuffer overlap): as fitted on megatron_te (0.45 on Hopper and Blackwell); 0
  natively (DTensor TP waits on each collective; torchtitan's async TP is opt-in).
- Column-parallel backward collectives under their GEMMs (`efficiency.tp_async_backward`): 1
  on megatron_te (megatron-core's `LinearWithGradAccumulationAndAsyncCommunication`), 0
  natively (DTensor redistributes synchronously).
- Pipeline send/receive overlap with VPP (`efficiency.p2p_overlap`): as fitted (0.9), 0
  natively (the pipelining schedules wait on their batched p2p).
- MoE all-to-all overlap (`parallel.moe_a2a_overlap`): as set; off natively.
- FP8 weights gathered in FP8 when `precision.fp8_param_gather` is unset: on with TE's
  Float8Tensor, off natively (torchao's FSDP2 float8 all-gather is opt-in).
- Memory (`RunSpec.torch_native`, llmctl.plan.memory): full sharding as FSDP2 runs it (fp32
  sharded parameters, per-block gathers, no reshard after forward with PP > 1), torch's cross
  entropy over fp32 logits, torchtitan's per-op selective recompute.
- Data-parallel / FSDP overlap and kernels (attention, GEMM fractions, element-wise passes):
  unchanged; no published pair of runs isolates them.

`apply_stack` is pure; `llmctl.run.planning.plan_input` applies `plan.stack` to the planner's
input, so `llmctl plan --stack`, `train`'s predicted step time and `--calibrate` agree.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from llmctl.plan.specs import PlanInput


class Stack(StrEnum):
    """Software stack of a run (`plan.stack`, `llmctl plan --stack`)."""

    megatron_te = "megatron_te"
    pytorch_native = "pytorch_native"


class FsdpImpl(StrEnum):
    """Which FSDP a full-sharding layout is priced as on the megatron_te stack (`plan.fsdp`).

    `megatron_fsdp`: Megatron-FSDP (Megatron-Bridge's, the published runs'). `torch_fsdp2`:
    megatron-core's torch FSDP2 wrapper, what `llmctl train` runs (`RunSpec.fsdp_wrapper`).
    The pytorch_native stack always prices torchtitan's FSDP2.
    """

    megatron_fsdp = "megatron_fsdp"
    torch_fsdp2 = "torch_fsdp2"


def apply_stack(inp: PlanInput, stack: Stack) -> PlanInput:
    """`inp` as `stack` runs it (see the module docstring); `megatron_te` is `inp` itself."""
    if stack == Stack.megatron_te:
        return inp
    eff = replace(inp.cluster.efficiency, tp_overlap=0.0, tp_async_backward=0.0, p2p_overlap=0.0)
    return replace(
        inp,
        cluster=replace(inp.cluster, efficiency=eff),
        run=replace(inp.run, moe_a2a_overlap=False, torch_native=True),
    )
