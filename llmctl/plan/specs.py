"""Frozen inputs of the planner: model shape, hardware, run, search options.

Why separate from `llmctl.config`: the config schema is mutable (Hydra needs that) and carries
many fields the planner does not use; the planner works on small frozen values built once by
`llmctl.config.planning`, so every function here is pure and cheap to call many times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Recompute(StrEnum):
    """Activation recompute granularity (Megatron's `recompute_granularity`)."""

    none = "none"
    selective = "selective"
    full = "full"


class Sharding(StrEnum):
    """Where parameters, gradients and optimizer states are sharded over data parallel ranks.

    `distributed` is Megatron's distributed optimizer (ZeRO-1: optimizer states and fp32 master
    weights); `full` shards parameters, gradients and states (ZeRO-3, Megatron FSDP).
    """

    none = "none"
    distributed = "distributed"
    full = "full"


class AttentionKernel(StrEnum):
    """Core attention implementation: `unfused` stores the a*s*s score matrices (Korthikanti
    et al. 2022), `flash` (Transformer Engine / FlashAttention) stores only the softmax
    statistics and recomputes the scores in the backward pass."""

    unfused = "unfused"
    flash = "flash"


BYTES: dict[str, float] = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Transformer shape. `vocab_size` is the padded vocabulary of embedding and logits."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    seq_length: int
    gated_mlp: bool
    layernorm_bias: bool
    add_bias_linear: bool
    learned_positions: int = 0
    tied_embeddings: bool = False
    dropout: bool = False
    num_experts: int = 0
    moe_router_topk: int = 1
    moe_ffn_hidden_size: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "vocab_size",
            "seq_length",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"{self.num_attention_heads} heads not divisible by "
                f"{self.num_query_groups} query groups"
            )

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixture-of-experts layers."""
        return self.num_experts > 0

    @property
    def expert_ffn(self) -> int:
        """Hidden size of one expert MLP."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Hardware: per-GPU peaks, memory, interconnect and named memory overheads."""

    name: str
    num_nodes: int
    gpus_per_node: int
    hbm_gib: float
    hbm_bandwidth_gbps: float
    peak_tflops: dict[str, float] = field(hash=False)
    achievable_fraction: dict[str, float] = field(hash=False)
    nvlink_domain_size: int
    nvlink_bandwidth_gbps: float
    internode_bandwidth_gbps: float
    internode_latency_us: float
    cuda_context_gib: float
    nccl_buffer_gib: float
    fragmentation_fraction: float

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("num_nodes and gpus_per_node must be >= 1")
        if self.hbm_gib <= 0:
            raise ValueError(f"hbm_gib must be > 0, got {self.hbm_gib}")

    @property
    def world_size(self) -> int:
        """Number of GPUs (ranks)."""
        return self.num_nodes * self.gpus_per_node

    def tflops(self, dtype: str) -> float:
        """Achievable dense TFLOP/s per GPU for `dtype` (peak times achievable fraction)."""
        if dtype not in self.peak_tflops:
            raise ValueError(f"cluster {self.name} states no peak TFLOP/s for {dtype}")
        return self.peak_tflops[dtype] * self.achievable_fraction.get(dtype, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """What one step computes and in which numerics.

    `grad_dtype` is the gradient buffer and reduction dtype: fp32 is Megatron-LM's default for
    bf16 training; Megatron-Bridge's performance recipes set `grad_reduce_in_fp32=False` (bf16).
    """

    global_batch_size: int
    compute_dtype: str
    params_dtype: str
    grad_dtype: str = "fp32"
    fp8: bool = False
    attention: AttentionKernel = AttentionKernel.flash
    train_tokens: float | None = None

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {self.global_batch_size}")
        for dtype in (self.compute_dtype, self.params_dtype, self.grad_dtype):
            if dtype not in BYTES:
                raise ValueError(f"unknown dtype {dtype}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """Fixed dimensions (None = search). Mirrors `cfg.parallel`."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    dp: int | None = None
    micro_batch_size: int | None = None
    sequence_parallel: bool | None = None
    recompute: Recompute | None = None
    sharding: Sharding | None = None
    allow_tp_outside_nvlink: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpec:
    """Search options: how many to show, memory headroom, micro-batch candidates."""

    top_k: int = 5
    headroom_fraction: float = 0.05
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    allow_uneven_pp: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.headroom_fraction < 1.0:
            raise ValueError(f"headroom_fraction must be in [0, 1), got {self.headroom_fraction}")
        if not self.micro_batch_sizes or min(self.micro_batch_sizes) < 1:
            raise ValueError("micro_batch_sizes must be a non-empty list of sizes >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInput:
    """Everything `plan()` needs."""

    model: ModelSpec
    cluster: ClusterSpec
    run: RunSpec
    constraints: Constraints = Constraints()
    search: SearchSpec = SearchSpec()
