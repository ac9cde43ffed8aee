"""Step time of one layout: compute, pipeline bubble and the exposed part of communication.

Why this shape: a training step on the bottleneck pipeline stage is (m + (pp-1)/vpp)
micro-batch slots (1F1B with the interleaved bubble (pp-1)/(vpp*m)), each slot the stage's
forward + backward of one micro-batch. A slot is GEMM time at the cluster's achievable
fraction of the dense peak of the compute dtype; core attention at the 16-bit rate (FP8
recipes keep attention in bf16), slowed for short chunks (context parallelism splits the
sequence into 2*CP chunks); memory-bound element-wise work (norms, activations, casts) at HBM
bandwidth; plus the exposed part of the tensor-parallel collectives (4 all-reduce
equivalents per layer, 6 with full recompute; sequence parallelism turns each into an
all-gather + reduce-scatter of the same volume), the context-parallel ring exchange of K/V
beyond what the attention compute hides, and MoE all-to-alls. Outside the slots: pipeline
p2p fill/drain, the data-parallel reduce-scatter/all-gather not hidden behind the last
micro-batch (per micro-batch for full sharding) and the optimizer step (memory bound).

The named constants below are the model's calibration knobs (docs/planner.md); the cluster's
`achievable_fraction` is the main one and `llmctl plan --calibrate RUN_DIR` rescales it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llmctl.plan.flops import recompute_factor, step_flops, token_flops
from llmctl.plan.layout import Layout, StageSplit
from llmctl.plan.memory import layer_activation_bytes
from llmctl.plan.params import embedding_params, layer_params, stage_params
from llmctl.plan.specs import BYTES, ClusterSpec, ModelSpec, Recompute, RunSpec, Sharding

#: Fraction of tensor-parallel collective time not hidden behind GEMMs.
TP_COMM_EXPOSED = 0.5
#: HBM passes over each layer's stored activations by element-wise kernels (fwd + bwd).
ELEMENTWISE_PASSES = 4.0
#: Bytes of HBM traffic per locally owned parameter in the Adam step (mixed precision).
OPTIMIZER_BYTES_PER_PARAM = 30.0
#: Attention chunk length (tokens) at which flash attention runs at half its large-chunk rate;
#: context parallelism splits the sequence into 2*CP chunks, so it pays through this term.
ATTENTION_CHUNK_KNEE = 256.0
#: NVLink collective latency per ring step, microseconds.
NVLINK_LATENCY_US = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Seconds per optimizer step, by named term."""

    compute_s: float
    bubble_s: float
    tp_comm_s: float
    cp_comm_s: float
    moe_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        """Step time."""
        return sum(self.terms().values())

    def terms(self) -> dict[str, float]:
        """Named terms in a stable order."""
        return {
            "compute": self.compute_s,
            "bubble": self.bubble_s,
            "tp_comm": self.tp_comm_s,
            "cp_comm": self.cp_comm_s,
            "moe_comm": self.moe_comm_s,
            "pp_comm": self.pp_comm_s,
            "dp_comm": self.dp_comm_s,
            "optimizer": self.optimizer_s,
        }


def _link(cluster: ClusterSpec, span: int) -> tuple[float, float]:
    """(bytes/s, latency s) of a group spanning `span` consecutive ranks."""
    if span <= cluster.nvlink_domain_size:
        return cluster.nvlink_bandwidth_gbps * 1e9, NVLINK_LATENCY_US * 1e-6
    return cluster.internode_bandwidth_gbps * 1e9, cluster.internode_latency_us * 1e-6


def ring_time(cluster: ClusterSpec, n: int, span: int, nbytes: float) -> float:
    """Seconds of one ring reduce-scatter or all-gather of `nbytes` over `n` ranks."""
    if n <= 1:
        return 0.0
    bw, lat = _link(cluster, span)
    return (n - 1) / n * nbytes / bw + (n - 1) * lat


def _slot(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, lay: Layout, layers: int, last: bool
) -> tuple[float, float, float, float]:
    """(compute, tp, cp, moe) seconds of one micro-batch forward+backward on a stage."""
    return _slot_cached(
        model,
        cluster,
        run,
        lay.tp,
        lay.cp,
        lay.ep,
        lay.micro_batch_size,
        lay.sequence_parallel,
        lay.recompute,
        layers,
        last,
    )


@lru_cache(maxsize=65536)
def _slot_cached(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    tp_size: int,
    cp_size: int,
    ep: int,
    mbs: int,
    sp: bool,
    recompute: Recompute,
    layers: int,
    last: bool,
) -> tuple[float, float, float, float]:
    lay = Layout(
        tp=tp_size,
        cp=cp_size,
        ep=ep,
        micro_batch_size=mbs,
        sequence_parallel=sp,
        recompute=recompute,
    )
    tok = lay.micro_batch_size * model.seq_length / lay.cp
    fl = token_flops(model)
    g_mul, c_mul = recompute_factor(fl, lay.recompute)
    gemm_rate = cluster.tflops(run.compute_dtype) * 1e12
    core_rate = cluster.tflops("bf16" if run.fp8 else run.compute_dtype) * 1e12
    gemm = tok * fl.layer_gemm * g_mul / lay.tp / gemm_rate
    chunk = model.seq_length / (2 * lay.cp) if lay.cp > 1 else float(model.seq_length)
    core_rate *= chunk / (chunk + ATTENTION_CHUNK_KNEE)
    core = tok * fl.layer_core_attention * c_mul / lay.tp / core_rate
    act = layer_activation_bytes(
        model,
        run,
        tp=lay.tp,
        cp=lay.cp,
        mbs=lay.micro_batch_size,
        sp=lay.sequence_parallel,
        recompute=Recompute.selective,
    )
    elem = ELEMENTWISE_PASSES * act * g_mul / (cluster.hbm_bandwidth_gbps * 1e9)
    compute = layers * (gemm + core + elem)
    if last:
        compute += tok * fl.logits / lay.tp / gemm_rate
    msg = tok * model.hidden_size * 2.0
    n_ar = 6 if lay.recompute == Recompute.full else 4
    tp = layers * n_ar * 2.0 * ring_time(cluster, lay.tp, lay.tp, msg) * TP_COMM_EXPOSED
    kv = 2.0 * tok * model.num_query_groups * model.kv_channels * 2.0 / lay.tp
    cp_ring = 3.0 * (lay.cp - 1) * kv / _link(cluster, lay.tp * lay.cp)[0]
    cp = layers * max(0.0, cp_ring - core)
    moe = 0.0
    if model.is_moe and lay.ep > 1:
        a2a = tok * model.moe_router_topk * model.hidden_size * 2.0 / lay.tp
        moe = layers * 4.0 * ring_time(cluster, lay.ep, lay.tp * lay.ep, a2a)
    return compute, tp, cp, moe


def _dp_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    lay: Layout,
    split: StageSplit,
    slot_s: float,
    m: int,
) -> float:
    """Exposed data-parallel communication seconds per step."""
    n = lay.dp * lay.cp
    if n == 1:
        return 0.0
    p = stage_params(
        model,
        tp=lay.tp,
        pp=lay.pp,
        ep=lay.ep,
        layers=split.bottleneck,
        first=lay.pp == 1,
        last=lay.pp == 1,
    )
    span = lay.tp * lay.cp * lay.dp
    wbytes = 2.0 if run.params_dtype != "fp32" else 4.0
    gbytes = BYTES[run.grad_dtype]
    rs = ring_time(cluster, n, span, p.dense * gbytes)
    ag = ring_time(cluster, n, span, p.dense * wbytes)
    if p.expert:
        ne = max(1, n // lay.ep)
        rs += ring_time(cluster, ne, span, p.expert * gbytes)
        ag += ring_time(cluster, ne, span, p.expert * wbytes)
    if lay.sharding == Sharding.full:
        return m * max(0.0, 2.0 * ag + rs - slot_s)
    if lay.sharding == Sharding.none:
        rs, ag = 2.0 * rs, 0.0
    return max(0.0, rs - 2.0 / 3.0 * slot_s) + max(0.0, ag - slot_s / 3.0)


def step_time(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> StepTime:
    """Predicted seconds per optimizer step of `layout`, by named term."""
    c, bubble, tp, cp, moe, p2p, dp, opt = time_terms(model, cluster, run, layout, split)
    return StepTime(
        compute_s=c,
        bubble_s=bubble,
        tp_comm_s=tp,
        cp_comm_s=cp,
        moe_comm_s=moe,
        pp_comm_s=p2p,
        dp_comm_s=dp,
        optimizer_s=opt,
    )


def _common(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> tuple[float, float, float, float, float, float]:
    """Sharding-independent seconds of one micro-batch slot: (compute, tp, cp, moe) on the
    bottleneck stage, then the bubble and pipeline p2p of the whole step."""
    pp = layout.pp
    slots = [_slot(model, cluster, run, layout, split.middle, pp == 1)]
    if pp > 1:
        slots.append(_slot(model, cluster, run, layout, split.last, True))
        slots.append(_slot(model, cluster, run, layout, split.first, False))
    c, tp, cp, moe = max(slots, key=sum)
    bubble = (pp - 1) / layout.vpp * (c + tp + cp + moe)
    msg = layout.micro_batch_size * model.seq_length / layout.cp * model.hidden_size * 2.0
    msg /= layout.tp if layout.sequence_parallel else 1
    bw, lat = _link(cluster, 2 * layout.tp * layout.cp * layout.dp)
    p2p = 2.0 * (pp - 1) * (msg / bw + lat) if pp > 1 else 0.0
    return c, tp, cp, moe, bubble, p2p


def _sharded(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    layout: Layout,
    split: StageSplit,
    slot_s: float,
    m: int,
) -> tuple[float, float]:
    """Seconds of (exposed DP communication, optimizer step) for `layout.sharding`."""
    dp = _dp_time(model, cluster, run, layout, split, slot_s, m)
    owned = layer_params(model, layout.tp, layout.ep).total * split.bottleneck
    owned += embedding_params(model, layout.tp) if layout.pp == 1 else 0
    shard = layout.dp * layout.cp if layout.sharding != Sharding.none else 1
    opt = owned / shard * OPTIMIZER_BYTES_PER_PARAM / (cluster.hbm_bandwidth_gbps * 1e9)
    return dp, opt


def time_terms(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> tuple[float, float, float, float, float, float, float, float]:
    """Seconds of (compute, bubble, tp, cp, moe, pp, dp, optimizer) per step."""
    m = layout.num_microbatches(run.global_batch_size)
    c, tp, cp, moe, bubble, p2p = _common(model, cluster, run, layout, split)
    dp, opt = _sharded(model, cluster, run, layout, split, c + tp + cp + moe, m)
    return m * c, bubble, m * tp, m * cp, m * moe, p2p, dp, opt


def step_s_options(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    layouts: list[Layout],
    split: StageSplit,
) -> list[float]:
    """Step seconds of layouts that differ only in sharding (the search's fast path)."""
    first = layouts[0]
    m = first.num_microbatches(run.global_batch_size)
    c, tp, cp, moe, bubble, p2p = _common(model, cluster, run, first, split)
    slot = c + tp + cp + moe
    base = m * slot + bubble + p2p
    return [base + sum(_sharded(model, cluster, run, lay, split, slot, m)) for lay in layouts]


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    """Derived rates of one step."""

    step_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    time_to_train_s: float | None


def throughput(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, world: int, step_s: float
) -> Throughput:
    """Tokens/s/GPU, model TFLOP/s/GPU, MFU and time to train `run.train_tokens`."""
    tokens = run.global_batch_size * model.seq_length
    tflops = step_flops(model, run.global_batch_size) / step_s / world / 1e12
    peak = cluster.peak_tflops.get(run.compute_dtype, 0.0)
    ttt = run.train_tokens / tokens * step_s if run.train_tokens else None
    return Throughput(
        step_s=step_s,
        tokens_per_s_per_gpu=tokens / step_s / world,
        tflops_per_gpu=tflops,
        mfu=tflops / peak if peak else 0.0,
        time_to_train_s=ttt,
    )
