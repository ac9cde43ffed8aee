"""The configuration schema: mutable keyword-only dataclasses, one per Hydra config group.

Hydra rejects overrides on frozen dataclasses, so these stay mutable; `validate()` checks them after
overrides and the planner receives frozen values built from them once (STYLE rules 5 and 6).
Every field carries a docstring in its metadata (`doc`): `llmctl recipes show` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf import MISSING

# One vocabulary with the planner (plan is the lower layer): parallel.recompute and
# parallel.optimizer_sharding take the planner's enums.
from llmctl.plan.specs import Recompute, Sharding
from llmctl.plan.stack import FsdpImpl, Stack


def doc(default: Any = MISSING, text: str = "", *, factory: Any = None) -> Any:
    """A dataclass field with a docstring kept in its metadata."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


class ModelFamily(StrEnum):
    llama = "llama"
    gpt = "gpt"


class Norm(StrEnum):
    layernorm = "layernorm"
    rmsnorm = "rmsnorm"


class Activation(StrEnum):
    gelu = "gelu"
    swiglu = "swiglu"


class PositionEmbedding(StrEnum):
    learned_absolute = "learned_absolute"
    rope = "rope"


class Dtype(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class AttentionBackend(StrEnum):
    auto = "auto"
    flash = "flash"
    fused = "fused"
    unfused = "unfused"


class Fp8Recipe(StrEnum):
    none = "none"
    delayed = "delayed"
    current = "current"


class UploadInFlight(StrEnum):
    """What a save does while the previous checkpoint's upload is still running."""

    wait = "wait"
    skip = "skip"


class PlacementPolicy(StrEnum):
    """What a SLURM job does when its nodes are not placed as the plan assumed."""

    strict = "strict"
    warn = "warn"
    off = "off"


class LauncherKind(StrEnum):
    local = "local"
    torchrun = "torchrun"
    slurm = "slurm"
    kubernetes = "kubernetes"


@dataclass(kw_only=True)
class ModelConfig:
    """Transformer shape: what megatron-core builds and what the memory and FLOP models need."""

    name: str = doc(text="Model name, e.g. llama3_70b.")
    family: ModelFamily = doc(ModelFamily.llama, "Architecture family: llama or gpt.")
    num_layers: int = doc(text="Number of transformer layers.")
    hidden_size: int = doc(text="Hidden (model) dimension h.")
    ffn_hidden_size: int = doc(text="MLP intermediate dimension.")
    num_attention_heads: int = doc(text="Number of attention (query) heads a.")
    num_query_groups: int = doc(text="Key/value head groups (GQA); equals heads for MHA.")
    kv_channels: int | None = doc(None, "Head dimension; None means hidden_size / heads.")
    vocab_size: int = doc(text="Padded vocabulary size used by the embedding and the logits.")
    seq_length: int = doc(text="Training sequence length s.")
    max_position_embeddings: int | None = doc(None, "Positions table size; None = seq_length.")
    normalization: Norm = doc(Norm.rmsnorm, "Normalization layer: layernorm or rmsnorm.")
    activation: Activation = doc(Activation.swiglu, "MLP activation: gelu or swiglu (gated).")
    position_embedding: PositionEmbedding = doc(
        PositionEmbedding.rope, "Position embedding: learned_absolute or rope."
    )
    rotary_base: float = doc(10000.0, "RoPE base frequency.")
    tied_embeddings: bool = doc(False, "Share the input embedding with the output layer.")
    add_bias_linear: bool = doc(False, "Bias terms in the linear layers (GPT-style).")
    num_experts: int = doc(0, "Number of MoE experts; 0 means a dense model.")
    moe_router_topk: int = doc(2, "Experts each token is routed to (MoE only).")
    moe_ffn_hidden_size: int | None = doc(None, "Expert MLP dimension; None = ffn_hidden_size.")
    init_method_std: float = doc(0.02, "Standard deviation of the weight initialisation.")
    norm_epsilon: float = doc(1e-5, "Epsilon of the normalization layers.")
    add_qkv_bias: bool = doc(False, "Biases on the Q, K, V projections only (Qwen2).")
    rope_scaling_factor: float | None = doc(
        None, "Llama 3.1 RoPE scaling factor (low 1, high 4, context 8192); None = off."
    )
    hf_vocab_size: int | None = doc(
        None, "Vocabulary before padding (import hf); export drops rows past it."
    )
    hf_architecture: str | None = doc(
        None, "Hugging Face class it was imported from; export writes it back."
    )
    hf_sliding_window: int | None = doc(
        None,
        "Sliding attention window of the imported model (Mistral); seq_length must stay "
        "within it (llmctl trains full causal attention); export writes it back.",
    )


@dataclass(kw_only=True)
class ClusterConfig:
    """The hardware: per-GPU peaks, memory, interconnects and named memory overheads."""

    name: str = doc(text="Cluster name, e.g. dgx_h100.")
    gpu_name: str = doc(text="Accelerator model, e.g. H100-SXM5-80GB (or the CPU model).")
    device: str = doc("cuda", "Device kind: cuda or cpu.")
    num_nodes: int = doc(1, "Number of nodes.")
    gpus_per_node: int = doc(8, "Accelerators (or ranks on CPU) per node.")
    hbm_gib: float = doc(text="Memory per accelerator, GiB.")
    hbm_bandwidth_gb_s: float = doc(
        text="Memory bandwidth per accelerator, GB/s (old name hbm_bandwidth_gbps)."
    )
    peak_tflops: dict[str, float] = doc(
        factory=dict, text="Dense peak TFLOP/s per dtype (fp32, tf32, bf16, fp16, fp8, fp4)."
    )
    achievable_fraction: dict[str, float] = doc(
        factory=dict, text="Fraction of peak large GEMMs reach in practice, per dtype."
    )
    nvlink_domain_size: int = doc(8, "GPUs sharing one NVLink domain (8 for DGX, 72 for NVL72).")
    nvlink_bandwidth_gb_s: float = doc(text="NVLink bandwidth per GPU, one direction, GB/s.")
    internode_bandwidth_gb_s: float = doc(text="Inter-node bandwidth per GPU, one direction, GB/s.")
    internode_latency_us: float = doc(5.0, "Inter-node message latency, microseconds.")
    nodes_per_switch: int | None = doc(
        None,
        "Nodes under one leaf switch of the inter-node network (non-blocking among them; a DGX "
        "SuperPOD scalable unit is 32); None = not stated (SLURM's topology is used).",
    )
    cuda_context_gib: float = doc(0.5, "Memory taken by the CUDA context and kernels, GiB.")
    nccl_buffer_gib: float = doc(1.0, "Memory taken by NCCL communicator buffers, GiB.")
    fragmentation_fraction: float = doc(0.05, "Allocator fragmentation, fraction of allocated.")
    cpu_cores: int | None = doc(None, "CPU cores per node, if known.")
    host_memory_gib: float | None = doc(None, "Host memory per node, GiB, if known.")
    sm_count: int = doc(0, "Streaming multiprocessors per GPU (wave quantization); 0 = ignore.")
    efficiency: dict[str, float] = doc(
        factory=dict,
        text="Step-time calibration knobs (llmctl.plan.Efficiency fields); written by "
        "`plan --calibrate`, defaults when absent.",
    )


@dataclass(kw_only=True)
class ParallelConfig:
    """The layout. Each None lets the planner search that dimension."""

    tp: int | None = doc(None, "Tensor-parallel size (inside the NVLink domain).")
    pp: int | None = doc(None, "Pipeline-parallel size.")
    vpp: int | None = doc(None, "Virtual pipeline stages per rank (interleaved 1F1B).")
    cp: int | None = doc(None, "Context-parallel size (splits the sequence).")
    ep: int | None = doc(None, "Expert-parallel size (MoE only).")
    etp: int | None = doc(
        None,
        "Expert tensor-parallel size (MoE only; megatron-core expert_tensor_parallel_size); "
        "None = tp, its default; not searched.",
    )
    dp: int | None = doc(None, "Data-parallel size; world / (tp*pp*cp) when searched.")
    micro_batch_size: int | None = doc(None, "Micro-batch size per rank.")
    sequence_parallel: bool | None = doc(None, "Sequence parallelism (needs tp > 1; GPU only).")
    recompute: Recompute | None = doc(None, "Activation recompute: none, selective or full.")
    optimizer_sharding: Sharding | None = doc(
        None, "Optimizer-state sharding: none, distributed (ZeRO-1) or full (FSDP)."
    )
    allow_tp_outside_nvlink: bool = doc(False, "Let TP cross the NVLink domain.")
    moe_a2a_overlap: bool = doc(
        False,
        "MoE only: overlap the expert-parallel all-to-alls of one micro-batch with another's "
        "compute (megatron-core overlap_moe_expert_parallel_comm; off by default). Needs EP > 1, "
        "no full recompute, VPP when PP > 1, 16-bit/FP8 compute and CUDA; the planner searches "
        "only such layouts when it is on.",
    )


@dataclass(kw_only=True)
class PrecisionConfig:
    """Numerics of the GEMMs and the parameters."""

    name: str = doc("fp32", "Precision recipe name: fp32, bf16, fp8_delayed or fp8_current.")
    dtype: Dtype = doc(Dtype.fp32, "Compute dtype of the GEMMs.")
    params_dtype: Dtype = doc(Dtype.fp32, "Dtype of the model parameters (fp32 or bf16).")
    fp8_recipe: Fp8Recipe = doc(Fp8Recipe.none, "FP8 scaling recipe (Transformer Engine).")
    fp8_amax_history_len: int = doc(1024, "Amax history length for delayed scaling.")
    grad_dtype: Dtype | None = doc(
        None, "Main-gradient buffer dtype; None = fp32 (megatron grad_reduce_in_fp32 for bf16)."
    )
    grad_reduce_dtype: Dtype | None = doc(
        None, "Data-parallel gradient reduce dtype; None = grad_dtype (one buffer in mcore)."
    )
    fp8_param_gather: bool | None = doc(
        None, "Keep GEMM weights in FP8 and all-gather them in FP8; None = on for FP8 recipes."
    )
    attention_backend: AttentionBackend = doc(
        AttentionBackend.auto,
        "Core attention kernel: auto (flash on CUDA with 16-bit/FP8 compute, else unfused), "
        "flash, fused or unfused; train passes it to megatron-core (flash/fused need TE).",
    )


class WandbMode(StrEnum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


@dataclass(kw_only=True)
class WandbConfig:
    """Weights & Biases tracking (needs the `track` extra); one W&B run per llmctl run."""

    project: str = doc("llmctl", "W&B project.")
    entity: str | None = doc(None, "W&B entity (user or team); None = the account's default.")
    mode: WandbMode = doc(WandbMode.offline, "offline (sync later), online or disabled.")
    tags: list[str] = doc(factory=list, text="Tags added to the W&B run.")


@dataclass(kw_only=True)
class MetricsConfig:
    """Prometheus metrics of every rank (needs the `train` extra); docs/monitoring.md."""

    port: int = doc(
        0, "Base port of each rank's /metrics endpoint (a rank serves port + local rank); 0 = off."
    )
    address: str = doc("127.0.0.1", "Address the endpoints bind to (0.0.0.0: every interface).")
    pushgateway: str | None = doc(
        None, "Pushgateway URL (http://HOST:9091) each rank pushes to; None = no pushes."
    )
    push_interval_s: float = doc(30.0, "Seconds between pushes (and one push at the end).")


class DivergencePolicy(StrEnum):
    """What `train.health.on_divergence` does with a divergent step (docs/monitoring.md)."""

    off = "off"
    stop = "stop"
    skip = "skip"
    rollback = "rollback"


@dataclass(kw_only=True)
class HealthConfig:
    """Hang watchdog and divergence policy of the training loop; docs/monitoring.md."""

    watchdog: bool = doc(True, "Run the hang watchdog (a thread per rank; exit code 75).")
    hang_factor: float = doc(
        10.0, "A hang is no step progress for hang_factor x the step time (plan, else measured)."
    )
    hang_floor_s: float = doc(300.0, "Shortest hang timeout, seconds (also before any step).")
    on_divergence: DivergencePolicy = doc(
        DivergencePolicy.stop,
        "NaN/Inf loss or grad norm, or a loss spike: stop (exit 4), skip the batch, rollback "
        "to the newest checkpoint past the bad data, or off.",
    )
    spike_factor: float = doc(
        0.0, "Loss above spike_factor x the median of the last spike_window steps diverges; 0=off."
    )
    spike_window: int = doc(20, "Steps of loss history the spike rule needs and looks at.")
    max_divergences: int = doc(
        5, "Divergent steps one run (process) may skip or roll back before it stops (exit 4)."
    )


class StragglerPolicy(StrEnum):
    """What a named straggler leads to (docs/monitoring.md, Stragglers)."""

    none = "none"
    exclude = "exclude"


@dataclass(kw_only=True)
class StragglerConfig:
    """Straggler detection in the run: ranks' compute times compared every window."""

    window_steps: int = doc(
        20, "Steps per window: each rank's median compute time is gathered every N steps; 0 = off."
    )
    margin: float = doc(
        0.25, "A rank is slow in a window when its compute time exceeds the others' median by this."
    )
    windows: int = doc(3, "Consecutive slow windows that name a straggler (and normal ones clear).")
    policy: StragglerPolicy = doc(
        StragglerPolicy.none,
        "none: name it; exclude: also record its host in RUN_DIR/excluded_hosts.json, which the "
        "next launch's hostfile skips.",
    )


class PeftMethod(StrEnum):
    """`train.peft`: parameter-efficient fine-tuning (docs/sft.md, LoRA)."""

    lora = "lora"


#: Hugging Face names of the linears LoRA can target (Llama-style), in PEFT's terms.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA adapters (`train.peft=lora`): W x + (alpha / rank) B A x on each target linear."""

    rank: int = doc(8, "Rank r of each adapter (A is r x in, B is out x r).")
    alpha: float = doc(16.0, "Scale numerator: the update is alpha / rank * B A x.")
    dropout: float = doc(0.0, "Dropout on the adapter's input (training only).")
    target_modules: list[str] = doc(
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        text="Hugging Face names of the adapted linears: q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj (megatron's linear_qkv, linear_proj, linear_fc1, "
        "linear_fc2).",
    )


class Objective(StrEnum):
    """What the loss of `llmctl train` is."""

    lm = "lm"
    dpo = "dpo"


class DpoLoss(StrEnum):
    """DPO loss on the policy/reference log-ratio difference (docs/finetune.md)."""

    sigmoid = "sigmoid"
    ipo = "ipo"


class DpoReference(StrEnum):
    """How the frozen reference's log-probabilities are obtained."""

    precomputed = "precomputed"


@dataclass(kw_only=True)
class DpoConfig:
    """Direct preference optimisation (`train.objective=dpo`, docs/finetune.md)."""

    beta: float = doc(0.1, "Strength of the KL constraint to the reference (DPO's beta).")
    loss: DpoLoss = doc(
        DpoLoss.sigmoid,
        "sigmoid: -log sigmoid(beta * margin) (DPO); ipo: (margin per token - 1/(2 beta))^2.",
    )
    label_smoothing: float = doc(
        0.0,
        "sigmoid only: the share of pairs assumed flipped (conservative DPO), in [0, 0.5).",
    )
    reference: DpoReference = doc(
        DpoReference.precomputed,
        "precomputed: one forward pass of the starting model over the pairs before step 1, "
        "kept in RUN_DIR/dpo_reference.npz (no second copy of the weights in memory).",
    )


@dataclass(kw_only=True)
class TrainConfig:
    """Optimisation schedule and run bookkeeping."""

    global_batch_size: int = doc(8, "Sequences per optimizer step, across all DP ranks.")
    train_iters: int = doc(50, "Optimizer steps to run.")
    train_tokens: float | None = doc(None, "Tokens for the time-to-train estimate of `plan`.")
    lr: float = doc(3e-4, "Peak learning rate.")
    min_lr: float = doc(3e-5, "Final learning rate of the cosine decay.")
    warmup_iters: int = doc(5, "Linear warm-up steps.")
    lr_decay_iters: int | None = doc(None, "Steps of cosine decay; None = train_iters.")
    weight_decay: float = doc(0.1, "AdamW weight decay.")
    adam_beta1: float = doc(0.9, "Adam beta1.")
    adam_beta2: float = doc(0.95, "Adam beta2.")
    adam_eps: float = doc(1e-8, "Adam epsilon.")
    clip_grad: float = doc(1.0, "Gradient-norm clipping threshold.")
    freeze_embeddings: bool = doc(
        False, "Freeze the input embeddings (fine-tuning): no gradients or optimizer state."
    )
    peft: PeftMethod | None = doc(
        None, "Parameter-efficient fine-tuning: lora = frozen base + adapters (train.lora)."
    )
    lora: LoraConfig = doc(factory=LoraConfig, text="LoRA adapters (train.peft=lora).")
    seed: int = doc(1234, "Random seed.")
    log_interval: int = doc(1, "Steps between metric records.")
    wandb: WandbConfig = doc(factory=WandbConfig, text="Weights & Biases tracking.")
    metrics: MetricsConfig = doc(factory=MetricsConfig, text="Prometheus metrics export.")
    health: HealthConfig = doc(factory=HealthConfig, text="Hang watchdog, divergence policy.")
    eval_interval: int = doc(25, "Steps between validation passes; 0 = never.")
    eval_iters: int = doc(2, "Validation batches per pass.")
    run_dir: str | None = doc(None, "Run directory; None = runs/<recipe>-<UTC timestamp>.")
    force: bool = doc(False, "Launch even if the plan predicts no fit (--ignore-fit).")
    straggler: StragglerConfig = doc(
        factory=StragglerConfig, text="Straggler detection (docs/monitoring.md)."
    )
    objective: Objective = doc(
        Objective.lm,
        "lm: next-token loss (pretraining, SFT); dpo: preference pairs from `llmctl data prefs`.",
    )
    dpo: DpoConfig = doc(factory=DpoConfig, text="DPO options (train.objective=dpo).")


@dataclass(kw_only=True)
class DataConfig:
    """Training data: Megatron indexed datasets and their blend."""

    prefixes: list[str] = doc(
        factory=list, text="Megatron .bin/.idx path prefixes; empty = build the demo corpus."
    )
    weights: list[float] | None = doc(None, "Blend weights, one per prefix; None = equal.")
    split: str = doc("98,2,0", "Train/valid/test split of each dataset, in parts.")
    tokenizer: str | None = doc(None, "Path to tokenizer.json; None = the demo tokenizer.")
    cache_dir: str | None = doc(None, "Where indices and the demo corpus are cached.")
    num_workers: int = doc(0, "Data-loader worker processes.")
    sft: bool | None = doc(
        None,
        "Supervised fine-tuning: true = data.prefixes must be SFT packs (`llmctl data sft`), "
        "false = they must not be; None = decided by the data (a sft-packed manifest).",
    )


class K8sApi(StrEnum):
    """The Kubernetes object `launcher=kubernetes` renders."""

    trainjob = "trainjob"
    jobset = "jobset"
    pytorchjob = "pytorchjob"


@dataclass(kw_only=True)
class K8sConfig:
    """`launcher=kubernetes`: the job's object, image, volumes and placement (launch/k8s.py)."""

    image: str | None = doc(
        None, "Container image with llmctl and its training extras (required; no default)."
    )
    namespace: str = doc("default", "Namespace of the rendered objects.")
    api: K8sApi = doc(
        K8sApi.trainjob,
        "trainjob (Kubeflow Trainer v2.2-v2.3), jobset (JobSet v1alpha2) or pytorchjob "
        "(Kubeflow training-operator v1.9).",
    )
    job_name: str | None = doc(
        None, "Object name (RFC 1123 label, at most 40 chars); None = from the run directory."
    )
    runtime_ref: str | None = doc(
        None,
        "TrainJob: a ClusterTrainingRuntime to use (restarts are then its own); None = render a "
        "TrainingRuntime of the job's own with llmctl's restart policy.",
    )
    gpu_resource: str = doc("nvidia.com/gpu", "Extended resource name of one GPU.")
    rdma_resource: str | None = doc(
        None, "Extended resource of the RDMA/IB devices (e.g. rdma/ib); None = no RDMA."
    )
    rdma_per_node: int = doc(1, "How many `rdma_resource` each pod asks for.")
    nccl_ib_hca: str | None = doc(None, "NCCL_IB_HCA for the pods (e.g. mlx5); None = NCCL's.")
    shm_size: str = doc("16Gi", "Size limit of the /dev/shm memory volume (quantity).")
    nvlink_label: str = doc(
        "nvidia.com/gpu.clique",
        "Node label naming a node's NVLink domain (GB200 NVL72: GPU feature discovery's clique).",
    )
    node_selector: dict[str, str] = doc(factory=dict, text="nodeSelector of every pod.")
    kueue_queue: str | None = doc(None, "Kueue LocalQueue (kueue.x-k8s.io/queue-name label).")
    kueue_topology: str | None = doc(
        None, "Kueue TAS: node label level the whole job should share (e.g. a block label)."
    )
    kueue_topology_required: bool = doc(
        False, "Kueue TAS: the job-level topology is required (else preferred)."
    )
    service_account: str | None = doc(None, "serviceAccountName of the pods.")
    secret_name: str | None = doc(
        None, "Secret whose keys named by launcher.secrets become env (secretKeyRef, no values)."
    )
    env_from_secrets: list[str] = doc(
        factory=list, text="Secrets whose every key becomes env (envFrom secretRef)."
    )
    pvc: str | None = doc(
        None, "PersistentVolumeClaim holding the run directory and checkpoints (required)."
    )
    pvc_mount: str = doc(
        "/runs", "Where the pods mount `pvc`; train.run_dir must lie under it (same path here)."
    )
    max_restarts: int = doc(
        3, "Whole-job restarts after a failure (JobSet failurePolicy); each resumes."
    )
    min_grace_s: int = doc(60, "Floor of terminationGracePeriodSeconds.")
    checkpoint_write_gb_s: float = doc(
        1.0, "Assumed checkpoint write bandwidth per pod, GB/s (for the grace period)."
    )


@dataclass(kw_only=True)
class LauncherConfig:
    """How processes are started: local torchrun, torchrun over ssh, or SLURM."""

    kind: LauncherKind = doc(
        LauncherKind.local, "local, torchrun (multi-node over ssh), slurm or kubernetes."
    )
    nproc_per_node: int | None = doc(None, "Processes per node; None = from the layout.")
    hostfile: str | None = doc(None, "Hostfile for the torchrun launcher (one host per line).")
    rdzv_port: int = doc(29500, "Rendezvous TCP port.")
    max_restarts: int = doc(0, "torchrun restarts of a failed worker group.")
    ssh_user: str | None = doc(None, "User for ssh launches; None = current user.")
    ssh_options: list[str] = doc(factory=list, text="Extra ssh options, e.g. -F CONFIG.")
    python: str | None = doc(None, "Python interpreter on the nodes; None = this one.")
    env: dict[str, str] = doc(factory=dict, text="Environment set for every rank.")
    secrets: list[str] = doc(
        factory=list, text="Names of environment variables passed through (never values)."
    )
    slurm_partition: str | None = doc(None, "SLURM partition.")
    slurm_account: str | None = doc(None, "SLURM account.")
    slurm_time: str = doc("01:00:00", "SLURM time limit.")
    slurm_job_name: str | None = doc(None, "SLURM job name; None = the run name.")
    slurm_signal: str = doc("USR1@90", "Signal and lead time sent before the time limit.")
    slurm_requeue: bool = doc(True, "Requeue the job on preemption or node failure.")
    slurm_extra: list[str] = doc(factory=list, text="Extra #SBATCH lines, verbatim options.")
    placement: PlacementPolicy = doc(
        PlacementPolicy.strict,
        "slurm, several nodes: strict = a job whose nodes span more leaf switches than the plan "
        "assumed (SLURM's topology) exits 2 before any rank starts; warn = one line, then run; "
        "off = no --switches and no check.",
    )
    slurm_switch_wait: str | None = doc(
        None,
        "How long SLURM may hold the job for the planned leaf-switch count (--switches=K@TIME); "
        "None = the cluster's max_switch_wait.",
    )
    # Elastic re-plan (docs/launch.md, "Elastic re-plan"; llmctl/launch/elastic.py).
    elastic: bool = doc(
        False,
        "torchrun: when a host is lost, re-plan on the hosts left and resume from the newest "
        "checkpoint; grow back when it answers again. slurm: --nodes=MIN-MAX, planned for the "
        "nodes granted.",
    )
    min_nodes: int = doc(1, "Elastic: fewest nodes the run continues on.")
    elastic_batch: str = doc(
        "keep_global",
        "Elastic batch policy: keep_global (same global batch, more gradient accumulation).",
    )
    elastic_probe_s: float = doc(10.0, "Elastic: seconds between probes of a lost host.")
    k8s: K8sConfig = doc(factory=K8sConfig, text="launcher=kubernetes settings.")


@dataclass(kw_only=True)
class CheckpointConfig:
    """Distributed checkpoints (megatron-core dist_checkpointing, torch_dist format)."""

    interval: int = doc(
        0,
        "Steps between checkpoints (also saved at the end); 0 = off, except that a requeueable "
        "SLURM job gets max(1, min(train_iters // 10, 1000)).",
    )
    async_save: bool = doc(True, "Write checkpoints asynchronously while training continues.")
    keep_last: int = doc(2, "Complete checkpoints kept, newest first.")
    keep_every: int | None = doc(None, "Also keep every N-th step as a milestone.")
    max_failed_saves: int = doc(3, "Stop cleanly after this many consecutive failed saves.")
    save_retries: int = doc(1, "Retries of a failed save before it counts as failed.")
    load: bool = doc(True, "Resume from the newest complete checkpoint if one exists.")
    init_from: str | None = doc(
        None, "Weights only at step 0: an imported dir, a checkpoint, or hf:DIR (Hugging Face)."
    )
    dir: str | None = doc(
        None,
        "Where committed checkpoints live: null = RUN_DIR/checkpoints; s3://BUCKET/PREFIX = an "
        "object store (endpoint and credentials from the AWS_* environment variables only). "
        "Saves still go to RUN_DIR/checkpoints first; a background thread uploads each commit.",
    )
    upload_in_flight: UploadInFlight = doc(
        UploadInFlight.wait,
        "A save due while the previous upload is still in flight: wait (block until it ends) "
        "or skip (this save is skipped).",
    )
    upload_timeout_s: float = doc(
        120.0,
        "An upload that sends no byte for this long (or a request unanswered this long) "
        "fails, and the failed-save policy applies.",
    )
    keep_local: bool = doc(
        False,
        "With an object store: keep the newest uploaded checkpoint in RUN_DIR/checkpoints too "
        "(a restart on this node loads it when identical to the store's newest).",
    )


@dataclass(kw_only=True)
class PlanConfig:
    """Search options of `llmctl plan`."""

    top_k: int = doc(5, "Layouts shown in the ranking.")
    headroom_fraction: float = doc(0.05, "Memory kept free on every accelerator.")
    micro_batch_sizes: list[int] = doc(
        factory=lambda: [1, 2, 4, 8], text="Micro-batch sizes the search considers."
    )
    allow_uneven_pp: bool = doc(False, "Allow PP sizes that do not divide the layer count.")
    balance_loss: bool = doc(
        False,
        "Move the output layer's time in layers off the loss stage (Megatron's "
        "pipeline_model_parallel_layout, as Megatron-Bridge perf recipes do); the planner "
        "times it and llmctl train builds it (PP > 1 without VPP).",
    )
    stack: Stack = doc(
        Stack.megatron_te,
        "Software stack priced: megatron_te (Megatron-core + Transformer Engine, what the "
        "cluster knobs were fitted on) or pytorch_native (torchtitan-like: no TE TP overlap, "
        "synchronous DTensor TP, no p2p or MoE all-to-all overlap); docs/planner.md.",
    )
    fsdp: FsdpImpl = doc(
        FsdpImpl.megatron_fsdp,
        "FSDP a full-sharding layout is priced as on megatron_te: megatron_fsdp "
        "(Megatron-FSDP, Megatron-Bridge's) or torch_fsdp2 (megatron-core's torch FSDP2 "
        "wrapper: 16-bit sharded gradients; what llmctl train runs, which sets it).",
    )
    published_layout: dict[str, Any] = doc(
        factory=dict,
        text="Layout of the published run a recipe reproduces (tp, pp, vpp, cp, dp, "
        "micro_batch_size, sequence_parallel, recompute, optimizer_sharding, loss_balanced); "
        "`plan --explain` compares the top pick with it.",
    )


@dataclass(kw_only=True)
class QuantConfig:
    """Post-training quantization (llm-compressor, compressed-tensors format)."""

    scheme: str = doc("W4A16", "W8A16, W4A16, W8A8 or FP8_DYNAMIC.")
    algorithm: str = doc("gptq", "rtn, gptq or awq (where the scheme allows).")
    group_size: int = doc(128, "Weight quantization group size.")
    ignore: list[str] = doc(factory=lambda: ["lm_head"], text="Modules left unquantized.")
    num_calibration_samples: int = doc(64, "Calibration sequences.")
    calibration_seq_length: int = doc(256, "Tokens per calibration sequence.")
    smoothing_strength: float = doc(0.8, "SmoothQuant alpha (W8A8 only).")


@dataclass(kw_only=True)
class RootConfig:
    """A whole run: one node per config group."""

    recipe: str = doc("", "Recipe this configuration was composed from.")
    model: ModelConfig = doc(factory=ModelConfig, text="Model shape.")
    cluster: ClusterConfig = doc(factory=ClusterConfig, text="Hardware.")
    parallel: ParallelConfig = doc(factory=ParallelConfig, text="Layout (None = search).")
    precision: PrecisionConfig = doc(factory=PrecisionConfig, text="Numerics.")
    train: TrainConfig = doc(factory=TrainConfig, text="Schedule and run bookkeeping.")
    data: DataConfig = doc(factory=DataConfig, text="Training data.")
    launcher: LauncherConfig = doc(factory=LauncherConfig, text="Process launcher.")
    checkpoint: CheckpointConfig = doc(factory=CheckpointConfig, text="Checkpointing.")
    plan: PlanConfig = doc(factory=PlanConfig, text="Planner search options.")
    quant: QuantConfig = doc(factory=QuantConfig, text="Quantization.")


GROUPS: tuple[str, ...] = (
    "model", "cluster", "parallel", "precision", "train", "data",
    "launcher", "checkpoint", "plan", "quant",
)  # fmt: skip

DEFAULT_CHOICES: dict[str, str] = {
    "model": "tiny",
    "cluster": "local_cpu",
    "parallel": "auto",
    "precision": "fp32",
    "train": "default",
    "data": "demo",
    "launcher": "local",
    "checkpoint": "default",
    "plan": "default",
    "quant": "default",
}
