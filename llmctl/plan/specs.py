"""Frozen inputs of the planner: model shape, hardware, run, search options.

Why separate from `llmctl.config`: the config schema is mutable (Hydra needs that) and carries
many fields the planner does not use; the planner works on small frozen values built once by
`llmctl.run.planning`, so every function here is pure and cheap to call many times.
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
    """Core attention implementation (megatron-core's `attention_backend`): `unfused` stores
    the a*s*s score matrices (Korthikanti et al. 2022); `flash` (FlashAttention) and `fused`
    (cuDNN fused attention through Transformer Engine) store only the softmax statistics and
    recompute the scores in the backward pass."""

    unfused = "unfused"
    flash = "flash"
    fused = "fused"


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Calibration knobs of the step-time model (one set per cluster; docs/planner.md).

    `achievable_fraction` (per dtype, on `ClusterSpec`) is the large-GEMM fraction of peak;
    these are the rest. `llmctl plan --calibrate` fits them from measured runs.
    """

    attention: float = 0.5
    """Fraction of the 16-bit dense peak the fused/flash attention kernel reaches."""
    tp_overlap: float = 0.5
    """Fraction of tensor-parallel collective time hidden behind GEMMs."""
    tp_async_backward: float = 1.0
    """1 when the column-parallel layers' backward TP collectives run under their data- and
    weight-gradient GEMMs (megatron-core); 0 when they wait (PyTorch DTensor, `plan.stack`)."""
    p2p_overlap: float = 0.5
    """Fraction of pipeline send/receive time hidden behind compute."""
    overlap_cost: float = 0.3
    """Fraction of each second of data-parallel / FSDP / context-parallel communication hidden
    behind compute that still costs compute time (NCCL kernels take SMs and HBM bandwidth)."""
    link: float = 0.8
    """Fraction of nominal link bandwidth collectives reach (NCCL bus bandwidth)."""
    elementwise_passes: float = 4.0
    """HBM passes over each layer's stored activations by element-wise kernels (norms,
    activations, dropout, FP8 casts), forward + backward."""
    layer_overhead_us: float = 0.0
    """Fixed microseconds per layer per micro-batch (forward + backward): kernel launches
    and small kernels the FLOP and byte terms miss."""
    chunk_overhead_us: float = 0.0
    """Fixed microseconds per micro-batch per virtual pipeline stage (schedule bookkeeping,
    synchronisation of each send/receive)."""
    cp_step_overhead_us: float = 0.0
    """Fixed microseconds per layer per extra context-parallel rank (forward + backward):
    the ring's per-step attention kernels, send/receive synchronisation and the merge of
    partial softmax results."""
    step_overhead_s: float = 0.0
    """Fixed seconds per optimizer step (gradient-norm all-reduce, data loader, logging)."""
    p2p_scatter_gather: float = 0.0
    """1 for 2022 Megatron-LM's `scatter_gather_tensors_in_pipeline` (on by default there;
    megatron-core has no such option, so 0): without sequence parallelism each TP rank sends
    1/TP of the boundary activation to the next stage, which all-gathers it over NVLink."""
    p2p_latency_us: float = 0.0
    """Fixed microseconds per pipeline send/receive on top of the link's own latency. 0 on
    GPUs (NCCL's latency is the link's); on CPU ranks, gloo's TCP round trip and megatron-core's
    p2p bookkeeping, run on the cores that compute (0.4 ms per message on the 2-core test host)."""

    def __post_init__(self) -> None:
        for name in ("attention", "link"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"efficiency.{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("tp_overlap", "p2p_overlap", "overlap_cost", "tp_async_backward"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"efficiency.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in (
            "elementwise_passes",
            "layer_overhead_us",
            "chunk_overhead_us",
            "cp_step_overhead_us",
            "p2p_latency_us",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"efficiency.{name} must be >= 0, got {getattr(self, name)}")
        if self.p2p_scatter_gather not in (0.0, 1.0):
            raise ValueError(
                f"efficiency.p2p_scatter_gather must be 0 or 1, got {self.p2p_scatter_gather}"
            )
        if self.step_overhead_s < 0:
            raise ValueError(f"efficiency.step_overhead_s must be >= 0, got {self.step_overhead_s}")


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
    hbm_bandwidth_gb_s: float
    peak_tflops: dict[str, float] = field(hash=False)
    achievable_fraction: dict[str, float] = field(hash=False)
    nvlink_domain_size: int
    nvlink_bandwidth_gb_s: float
    internode_bandwidth_gb_s: float
    internode_latency_us: float
    cuda_context_gib: float
    nccl_buffer_gib: float
    fragmentation_fraction: float
    sm_count: int = 0
    efficiency: Efficiency = Efficiency()
    nodes_per_switch: int | None = None
    """Nodes under one leaf switch (placement only: the step time assumes a non-blocking
    network among the job's nodes); None = not stated."""

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("num_nodes and gpus_per_node must be >= 1")
        if self.hbm_gib <= 0:
            raise ValueError(f"hbm_gib must be > 0, got {self.hbm_gib}")
        if self.nodes_per_switch is not None and self.nodes_per_switch < 1:
            raise ValueError(f"nodes_per_switch must be >= 1, got {self.nodes_per_switch}")

    @property
    def world_size(self) -> int:
        """Number of GPUs (ranks)."""
        return self.num_nodes * self.gpus_per_node

    def tflops(self, dtype: str) -> float:
        """Achievable dense TFLOP/s per GPU for `dtype` (peak times achievable fraction)."""
        if dtype not in self.peak_tflops:
            stated = [d for d in ("bf16", "fp16", "fp32") if d in self.peak_tflops]
            other = f" (e.g. precision={stated[0]})" if stated else ""
            raise ValueError(
                f"cluster {self.name} states no peak TFLOP/s for {dtype}: add "
                f"peak_tflops.{dtype} (and achievable_fraction.{dtype}) to the cluster file "
                f"given to --cluster-file, or plan another precision{other}"
            )
        return self.peak_tflops[dtype] * self.achievable_fraction.get(dtype, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """What one step computes and in which numerics.

    `grad_dtype` is the main-gradient buffer, `grad_reduce_dtype` the dtype of the
    data-parallel reduce-scatter. In megatron-core both are one buffer: fp32 when
    `grad_reduce_in_fp32` else the parameter dtype (DistributedDataParallel). Megatron-LM
    turns `grad_reduce_in_fp32` on for bf16, as do Megatron-Bridge's `bf16_mixed` and FP8
    mixed recipes; Bridge's performance recipes turn it off (bf16 gradients).
    `fp8_param_gather` keeps the GEMM weights in FP8 (Transformer Engine Float8Tensor) and
    all-gathers them in FP8 (Bridge's FP8 recipes set it).
    """

    global_batch_size: int
    compute_dtype: str
    params_dtype: str
    grad_dtype: str = "fp32"
    grad_reduce_dtype: str = "fp32"
    fp8: bool = False
    fp8_param_gather: bool = False
    attention: AttentionKernel = AttentionKernel.flash
    train_tokens: float | None = None
    freeze_embeddings: bool = False
    """Input embeddings frozen (fine-tuning): they get no gradient or optimizer state."""
    lora_rank: int = 0
    """LoRA (`train.peft=lora`, llmctl.plan.lora): adapter rank; 0 = no LoRA."""
    lora_targets: tuple[str, ...] = ()
    """Hugging Face names of the adapted linears (q_proj ... down_proj)."""
    fused_kernels: bool = True
    """Transformer Engine / fused CUDA kernels (masked softmax, RoPE, SwiGLU, norms). False is
    megatron-core's local CPU path, whose unfused kernels save more for backward (measured by
    the CPU memory oracle; `llmctl.plan.memory`)."""
    torch_native: bool = False
    """Memory as PyTorch-native training runs it (torchtitan): full sharding is FSDP2 (fp32
    sharded parameters, per-block gathers, no reshard after forward with PP > 1), the loss is
    torch's cross entropy over fp32 logits, selective recompute is torchtitan's per-op
    policy (`llmctl.plan.memory`)."""
    fsdp_wrapper: bool = False
    """Full sharding as `llmctl train` runs it: megatron-core's torch FSDP2 wrapper
    (`TorchFullyShardedDataParallel`) under megatron's optimizer, in place of Megatron-FSDP.
    No mixed-precision policy, so gradients are sharded in the parameter dtype; the root unit
    (final norm and output layer) stays gathered through forward and backward and the
    backward prefetches one layer (`llmctl.plan.memory.gathered_bytes`; measured by the CPU
    memory oracle). Ignored with `torch_native`."""
    moe_a2a_overlap: bool = False
    """MoE all-to-alls overlapped with another micro-batch's compute (megatron-core
    `overlap_moe_expert_parallel_comm`; off by default, on in Megatron-Bridge's Qwen3-235B
    H100 recipe)."""

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {self.global_batch_size}")
        for dtype in (self.compute_dtype, self.params_dtype, self.grad_dtype):
            if dtype not in BYTES:
                raise ValueError(f"unknown dtype {dtype}")
        if self.grad_reduce_dtype not in BYTES:
            raise ValueError(f"unknown dtype {self.grad_reduce_dtype}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    """Fixed dimensions (None = search). Mirrors `cfg.parallel`."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    """Expert tensor-parallel size; None = TP (megatron-core's default), not searched."""
    dp: int | None = None
    micro_batch_size: int | None = None
    sequence_parallel: bool | None = None
    recompute: Recompute | None = None
    optimizer_sharding: Sharding | None = None
    allow_tp_outside_nvlink: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpec:
    """Search options: how many to show, memory headroom, micro-batch candidates."""

    top_k: int = 5
    headroom_fraction: float = 0.05
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    allow_uneven_pp: bool = False
    balance_loss: bool = False

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
