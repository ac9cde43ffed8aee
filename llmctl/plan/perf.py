"""Step time of one layout: GEMMs, attention, element-wise work, communication, schedule.

Why this shape: a training step on the bottleneck pipeline stage is m micro-batch slots plus
the pipeline bubble ((pp-1)/vpp slots for the interleaved 1F1B schedule), each slot the
stage's forward + backward of one micro-batch. Inside a slot:

- GEMMs one by one (QKV, projection, fc1, fc2, logits; forward, data-gradient and
  weight-gradient shapes), each at the cluster's large-GEMM `achievable_fraction` of the dense
  peak of the compute dtype, reduced by wave quantization (output tiles of 128x128 over
  `sm_count` SMs) and never faster than moving its operands through HBM (memory-bound small
  GEMMs). Small models, wide TP and small micro-batches cost what their GEMM shapes cost.
- Core attention: flash/fused kernels at `efficiency.attention` of the 16-bit peak (FP8
  recipes keep attention in bf16), slower for short chunks (context parallelism splits the
  sequence into 2*CP chunks); the unfused kernel as score GEMMs plus softmax/mask passes.
- Element-wise kernels (norms, activations, casts) at HBM bandwidth, a fixed
  `efficiency.layer_overhead_us` per layer, `efficiency.chunk_overhead_us` per virtual stage.
- Exposed communication: tensor-parallel all-gathers/reduce-scatters (the forward ones and
  SP's row-parallel backward gathers at 1 - `tp_overlap`, the column-parallel backward ones
  under their GEMMs as megatron-core schedules them), the
  context-parallel K/V ring beyond the attention time that hides it, MoE all-to-alls.

Outside the slots: pipeline sends/receives (2 per micro-batch per virtual stage, so their
number grows with VPP x micro-batches; `p2p_overlap` of the steady-state ones hidden, fill
and drain exposed), the data-parallel reduce-scatter (in `grad_reduce_dtype`) and parameter
all-gather (fp8 with `fp8_param_gather`) beyond what the last micro-batch hides, the
optimizer step (memory bound) and a fixed per-step overhead. Links run at `efficiency.link`
of their nominal bandwidth. The knobs are fitted per cluster (docs/planner.md) and refitted
on measured runs by `llmctl plan --calibrate`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from math import ceil

from llmctl.plan import moe as moe_terms
from llmctl.plan.flops import recompute_factor, step_flops, token_flops
from llmctl.plan.layout import Layout, StageSplit
from llmctl.plan.memory import layer_activation_bytes
from llmctl.plan.params import LayerParams, layer_params, stage_params
from llmctl.plan.specs import (
    BYTES,
    AttentionKernel,
    ClusterSpec,
    ModelSpec,
    Recompute,
    RunSpec,
    Sharding,
)

#: Output tile of a tensor-core GEMM (rows x columns) for wave quantization.
TILE = 128
#: HBM bytes per element of the a*s*s score matrix moved by the unfused kernel (bf16 scores,
#: 1-byte dropout mask), forward: Q.K^T writes S (2), scale-mask-softmax reads S and writes P
#: (4), dropout reads P, writes P' and the mask (5), P'.V reads P' (2).
UNFUSED_SCORE_FWD_BYTES = 13.0
#: ... backward: dP' written and P' read by the V-side GEMMs (4), dropout backward reads dP'
#: and the mask, writes dP (5), softmax backward reads P and dP, writes dS (6), the Q/K-side
#: GEMMs read dS twice (4). Recompute (selective or full) runs the forward bytes again.
UNFUSED_SCORE_BWD_BYTES = 19.0
#: Attention chunk length (tokens) at which flash attention runs at half its long-chunk rate.
ATTENTION_CHUNK_KNEE = 256.0
#: NVLink collective latency per ring step, microseconds.
NVLINK_LATENCY_US = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    """Seconds per optimizer step, by named term."""

    gemm_s: float
    attention_s: float
    elementwise_s: float
    overhead_s: float
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

    @property
    def compute_s(self) -> float:
        """GEMM, attention and element-wise seconds together."""
        return self.gemm_s + self.attention_s + self.elementwise_s

    def terms(self) -> dict[str, float]:
        """Named terms in a stable order."""
        return {
            "gemm": self.gemm_s,
            "attention": self.attention_s,
            "elementwise": self.elementwise_s,
            "overhead": self.overhead_s,
            "bubble": self.bubble_s,
            "tp_comm": self.tp_comm_s,
            "cp_comm": self.cp_comm_s,
            "moe_comm": self.moe_comm_s,
            "pp_comm": self.pp_comm_s,
            "dp_comm": self.dp_comm_s,
            "optimizer": self.optimizer_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """Seconds of one micro-batch forward + backward on one stage, by kind."""

    gemm: float
    attention: float
    elementwise: float
    overhead: float
    tp: float
    cp: float
    moe: float

    @property
    def total(self) -> float:
        """The whole slot."""
        return (
            self.gemm + self.attention + self.elementwise + self.overhead + self.tp + self.cp
        ) + self.moe


def _link(cluster: ClusterSpec, span: int) -> tuple[float, float]:
    """(bytes/s, latency s) of a group spanning `span` consecutive ranks."""
    eff = cluster.efficiency.link
    if span <= cluster.nvlink_domain_size:
        return cluster.nvlink_bandwidth_gb_s * 1e9 * eff, NVLINK_LATENCY_US * 1e-6
    return cluster.internode_bandwidth_gb_s * 1e9 * eff, cluster.internode_latency_us * 1e-6


def ring_time(cluster: ClusterSpec, n: int, span: int, nbytes: float) -> float:
    """Seconds of one reduce-scatter or all-gather of `nbytes` over `n` ranks spread evenly
    over `span` consecutive ranks. Inside the NVLink domain a ring; across nodes NCCL's
    hierarchical form: an NVLink stage over the r group ranks of a node, then N nodes
    exchange 1/r of the data each over their own NICs (every GPU has one)."""
    if n <= 1:
        return 0.0
    if span <= cluster.nvlink_domain_size:
        bw, lat = _link(cluster, span)
        return (n - 1) / n * nbytes / bw + (n - 1) * lat
    nodes = min(n, max(1, ceil(span / cluster.nvlink_domain_size)))
    r = max(1, n // nodes)
    nvl, nvl_lat = _link(cluster, 1)
    ib, ib_lat = _link(cluster, span)
    intra = (r - 1) / r * nbytes / nvl + (r - 1) * nvl_lat
    return intra + (nodes - 1) / nodes * nbytes / (r * ib) + (nodes - 1) * ib_lat


def all_to_all_s(cluster: ClusterSpec, n: int, span: int, nbytes: float) -> float:
    """Seconds of an all-to-all in which each of `n` ranks, spread evenly over `span`
    consecutive ranks, sends `nbytes` split evenly over the `n` ranks (MoE token dispatch).
    Unlike a reduce-scatter there is no hierarchical shortcut: every GPU pushes its off-node
    share through its own NIC while the on-node share crosses NVLink at the same time."""
    if n <= 1:
        return 0.0
    nodes = min(n, max(1, ceil(span / cluster.nvlink_domain_size)))
    r = max(1, n // nodes)
    nvl, nvl_lat = _link(cluster, 1)
    intra = (r - 1) / n * nbytes / nvl + nvl_lat
    if nodes == 1:
        return intra
    ib, ib_lat = _link(cluster, span)
    return max(intra, (n - r) / n * nbytes / ib + ib_lat)


def gemm_s(cluster: ClusterSpec, dtype: str, m: float, n: float, k: float) -> float:
    """Seconds of one (m x k) @ (k x n) GEMM: compute at the achievable rate after wave
    quantization, or HBM traffic of its operands, whichever is longer."""
    rate = cluster.tflops(dtype) * 1e12
    if cluster.sm_count:
        tiles = ceil(m / TILE) * ceil(n / TILE)
        waves = ceil(tiles / cluster.sm_count)
        rate *= tiles / (waves * cluster.sm_count)
    traffic = BYTES[dtype] * (m * k + k * n) + 2.0 * m * n
    return max(2.0 * m * n * k / rate, traffic / (cluster.hbm_bandwidth_gb_s * 1e9))


def _fwd_bwd(cluster: ClusterSpec, dtype: str, m: float, n: float, k: float, fwd: float) -> float:
    """Forward (`fwd` times, 2 with full recompute), data-gradient and weight-gradient GEMMs."""
    return (
        fwd * gemm_s(cluster, dtype, m, n, k)
        + gemm_s(cluster, dtype, m, k, n)
        + (gemm_s(cluster, dtype, n, k, m))
    )


@lru_cache(maxsize=65536)
def layer_gemm_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    dtype: str,
    tokens: float,
    tp: int,
    ep: int,
    fwd: float,
    etp: int | None = None,
) -> float:
    """GEMM seconds of one layer for `tokens` tokens on one TP rank (forward + backward);
    the experts split over `etp` ranks (None = TP) that share the routed tokens of their
    `etp` sequence-parallel shares, hence `tokens * etp / tp` at expert TP `etp`."""
    h, d = model.hidden_size, model.kv_channels
    q, kv = model.num_attention_heads * d, model.num_query_groups * d
    width = 2 if model.gated_mlp else 1
    t = _fwd_bwd(cluster, dtype, tokens, (q + 2 * kv) / tp, h, fwd)
    t += _fwd_bwd(cluster, dtype, tokens, h, q / tp, fwd)
    if not model.is_moe:
        f = model.ffn_hidden_size
        t += _fwd_bwd(cluster, dtype, tokens, width * f / tp, h, fwd)
        return t + _fwd_bwd(cluster, dtype, tokens, h, f / tp, fwd)
    e = etp or tp
    return t + moe_terms.expert_gemm_s(model, cluster, dtype, tokens * e / tp, e, ep, fwd)


def _attention_s(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, lay: Layout, tokens: float, mul: float
) -> float:
    """Core-attention seconds of one layer (forward + backward, `mul` for recompute)."""
    dtype16 = "bf16" if run.fp8 else run.compute_dtype
    flops = tokens * token_flops(model).layer_core_attention * mul / lay.tp
    if run.attention == AttentionKernel.unfused:
        scores = lay.micro_batch_size * model.num_attention_heads / lay.tp
        scores *= model.seq_length / lay.cp * model.seq_length
        passes = UNFUSED_SCORE_FWD_BYTES * (3.0 * mul - 2.0) + UNFUSED_SCORE_BWD_BYTES
        memory = passes * scores / (cluster.hbm_bandwidth_gb_s * 1e9)
        return 2.0 * flops / (cluster.tflops(dtype16) * 1e12) + memory
    chunk = model.seq_length / (2 * lay.cp) if lay.cp > 1 else float(model.seq_length)
    rate = cluster.peak_tflops.get(dtype16, cluster.tflops(dtype16)) * 1e12
    rate *= cluster.efficiency.attention * chunk / (chunk + ATTENTION_CHUNK_KNEE)
    return flops / rate


def _slot(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, lay: Layout, layers: int, last: bool
) -> Slot:
    """Seconds of one micro-batch forward + backward on a stage of `layers` layers."""
    return _slot_cached(
        model,
        cluster,
        run,
        lay.tp,
        lay.cp,
        lay.ep,
        lay.vpp,
        lay.micro_batch_size,
        lay.sequence_parallel,
        lay.recompute,
        layers,
        last,
        lay.etp,
    )


@lru_cache(maxsize=65536)
def _slot_cached(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    tp: int,
    cp: int,
    ep: int,
    vpp: int,
    mbs: int,
    sp: bool,
    recompute: Recompute,
    layers: int,
    last: bool,
    etp: int | None = None,
) -> Slot:
    lay = Layout(
        tp=tp,
        cp=cp,
        ep=ep,
        etp=etp,
        micro_batch_size=mbs,
        sequence_parallel=sp,
        recompute=recompute,
    )
    tok = mbs * model.seq_length / cp
    fl = token_flops(model)
    g_mul, c_mul = recompute_factor(fl, recompute)
    fwd = 2.0 if recompute == Recompute.full else 1.0
    gemm = layers * layer_gemm_s(model, cluster, run.compute_dtype, tok, tp, ep, fwd, etp)
    if last:
        gemm += _logits_s(model, cluster, run, tok, tp)
    core = _attention_s(model, cluster, run, lay, tok, c_mul)
    # the bytes element-wise kernels touch, sized by megatron's selective activations: a
    # measure of the layer's tensors, not of what a stack's recompute policy keeps
    act = layer_activation_bytes(
        model,
        replace(run, torch_native=False) if run.torch_native else run,
        tp=tp,
        cp=cp,
        mbs=mbs,
        sp=sp,
        recompute=Recompute.selective,
    )
    elem = cluster.efficiency.elementwise_passes * act * g_mul / (cluster.hbm_bandwidth_gb_s * 1e9)
    eff = cluster.efficiency
    per_layer = eff.layer_overhead_us * fwd + eff.cp_step_overhead_us * (cp - 1)
    overhead = (layers * per_layer + vpp * eff.chunk_overhead_us) * 1e-6
    tp_s = layers * _tp_comm_s(model, cluster, run.compute_dtype, tok, tp, sp, fwd)
    kv = 2.0 * tok * model.num_query_groups * model.kv_channels * 2.0 / tp
    bw, lat = _link(cluster, tp * cp)
    ring = 3.0 * (cp - 1) * (kv / bw + lat) if cp > 1 else 0.0
    cp_s = layers * _exposed(ring, core, eff.overlap_cost)
    moe = 0.0
    if model.is_moe:
        elem += moe_terms.memory_s(model, cluster, tok, tp, fwd)
    e = etp or tp
    if model.is_moe and (ep > 1 or e > 1):
        # megatron-core's alltoall dispatcher: the EP all-to-all (its group strided by ETP,
        # so spanning ETP*EP ranks), then with ETP > 1 an all-gather of the routed tokens
        # over the ETP group (reduce-scatter in the combine); backward mirrors both.
        sent = moe_terms.dispatch_bytes(model, tok, tp)
        span = moe_terms.ep_span(tp, ep, etp)
        a2a = 4.0 * (all_to_all_s(cluster, ep, span, sent) + ring_time(cluster, e, e, e * sent))
        window = gemm / layers + core + elem
        overlap = run.moe_a2a_overlap and ep > 1
        moe = layers * moe_terms.exposed_a2a_s(a2a, window, overlap, eff.overlap_cost)
    return Slot(
        gemm=gemm,
        attention=layers * core,
        elementwise=layers * elem,
        overhead=overhead,
        tp=tp_s,
        cp=cp_s,
        moe=moe,
    )


def layer_s(model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout) -> float:
    """Seconds of one transformer layer's forward + backward for one micro-batch (what
    Korthikanti et al. 2022 Table 4 measures): a one-layer slot without per-chunk costs."""
    slot = _slot(model, cluster, run, layout, 1, False)
    return slot.total - layout.vpp * cluster.efficiency.chunk_overhead_us * 1e-6


@lru_cache(maxsize=65536)
def _tp_comm_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    dtype: str,
    tok: float,
    tp: int,
    sp: bool,
    fwd: float,
) -> float:
    """Exposed tensor-parallel communication seconds of one layer and micro-batch.

    Counted in units of one all-gather or reduce-scatter of the layer's [tokens, hidden]
    bf16 activation (an all-reduce is two). Each forward (two with full recompute) runs two
    all-reduces, or with sequence parallelism two all-gathers and two reduce-scatters. In the
    backward, megatron-core's `LinearWithGradAccumulationAndAsyncCommunication` launches the
    column-parallel layers' (QKV, fc1) collectives asynchronously: the data-gradient
    all-reduce, or with SP the input re-gather and the data-gradient reduce-scatter, run
    under the data- and weight-gradient GEMMs (4 units, hidden up to those GEMMs' time at
    `overlap_cost`); SP's row-parallel layers all-gather their output gradient exposed (2).
    `tp_overlap` is the share of the exposed units hidden beyond that (e.g. Transformer
    Engine's userbuffer overlap); `tp_async_backward` 0 (PyTorch DTensor) exposes the 4 units
    too. A MoE layer's experts run no TP collectives of their own
    (megatron-core's explicit expert communication: the token dispatcher moves the routed
    tokens, counted as MoE communication), so only the attention block's half remains.
    """
    if tp == 1:
        return 0.0
    eff = cluster.efficiency
    unit = ring_time(cluster, tp, tp, tok * model.hidden_size * 2.0)
    blocks = 1.0 if model.is_moe else 2.0
    exposed = (2.0 * blocks * fwd + (blocks if sp else 0.0)) * unit * (1.0 - eff.tp_overlap)
    window = column_bwd_gemm_s(model, cluster, dtype, tok, tp) * eff.tp_async_backward
    return exposed + _exposed(2.0 * blocks * unit, window, eff.overlap_cost)


@lru_cache(maxsize=65536)
def column_bwd_gemm_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    dtype: str,
    tokens: float,
    tp: int,
) -> float:
    """Backward GEMM seconds of one layer's column-parallel layers (QKV, fc1) on one TP rank:
    the compute that hides megatron-core's asynchronous backward TP collectives (QKV alone
    in a MoE layer, whose experts have no TP collectives)."""
    h, d = model.hidden_size, model.kv_channels
    q, kv = model.num_attention_heads * d, model.num_query_groups * d
    width = 2 if model.gated_mlp else 1
    t = _fwd_bwd(cluster, dtype, tokens, (q + 2 * kv) / tp, h, 0.0)
    if model.is_moe:
        return t
    return t + _fwd_bwd(cluster, dtype, tokens, width * model.ffn_hidden_size / tp, h, 0.0)


@lru_cache(maxsize=65536)
def _logits_s(model: ModelSpec, cluster: ClusterSpec, run: RunSpec, tok: float, tp: int) -> float:
    """Output-layer GEMMs (bf16 under FP8 recipes: Transformer Engine leaves them 16-bit)."""
    dtype = "bf16" if run.fp8 else run.compute_dtype
    return _fwd_bwd(cluster, dtype, tok, model.vocab_size / tp, model.hidden_size, 1.0)


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
    p = rank_params(model, lay.tp, lay.pp, lay.ep, split, lay.etp)
    span = lay.tp * lay.cp * lay.dp
    wbytes = 1.0 if run.fp8_param_gather else BYTES[run.params_dtype]
    gbytes = BYTES[run.grad_reduce_dtype]
    rs = ring_time(cluster, n, span, p.dense * gbytes)
    ag = ring_time(cluster, n, span, p.dense * wbytes)
    if p.expert:
        ne = lay.expert_dp
        rs += ring_time(cluster, ne, span, p.expert * gbytes)
        ag += ring_time(cluster, ne, span, p.expert * wbytes)
    cost = cluster.efficiency.overlap_cost
    if lay.optimizer_sharding == Sharding.full:
        # Megatron FSDP gathers each layer before its forward and reduce-scatters it after its
        # backward: the step's first gather and last reduce-scatter have nothing to hide behind.
        unit = layer_params(model, lay.tp, lay.ep).dense
        tail = ring_time(cluster, n, span, unit * wbytes)
        tail = min(tail + ring_time(cluster, n, span, unit * gbytes), 2.0 * ag + rs)
        return tail + m * _exposed(2.0 * ag + rs - tail / m, slot_s, cost)
    # megatron-core DDP reduces gradients in buckets of max(40M, 1M x DP) parameters as the
    # backward produces them; the last bucket's reduce (and, sharded, the next step's first
    # parameter gather) finishes after the compute it could hide behind.
    bucket = min(float(p.dense), max(4e7, 1e6 * lay.dp))
    rs_tail = ring_time(cluster, n, span, bucket * gbytes)
    ag_tail = ring_time(cluster, n, span, bucket * wbytes)
    if lay.optimizer_sharding == Sharding.none:
        rs, ag, rs_tail, ag_tail = 2.0 * rs, 0.0, 2.0 * rs_tail, 0.0
    return (
        rs_tail
        + _exposed(rs - rs_tail, 2.0 / 3.0 * slot_s, cost)
        + ag_tail
        + _exposed(ag - ag_tail, slot_s / 3.0, cost)
    )


@lru_cache(maxsize=65536)
def rank_params(
    model: ModelSpec, tp: int, pp: int, ep: int, split: StageSplit, etp: int | None = None
) -> LayerParams:
    """Parameters of the rank that holds the most: the first stage adds the embeddings, the
    last the output layer (its own copy when tied and PP > 1). Its gradient reduce and
    optimizer step finish last, and the step waits for it."""
    stages = [(split.first, True, pp == 1), (split.last, pp == 1, True)]
    if pp > 2:
        stages.append((split.middle, False, False))
    held = (
        stage_params(model, tp=tp, pp=pp, ep=ep, layers=n, first=first, last=last, etp=etp)
        for n, first, last in stages
    )
    return max(held, key=lambda p: p.total)


def _exposed(comm: float, window: float, cost: float) -> float:
    """Seconds `comm` adds when overlapped with `window` seconds of compute: the part that
    does not fit, plus `cost` of the hidden part (SMs and HBM taken by the collective)."""
    hidden = min(comm, window)
    return comm - hidden + cost * hidden


def step_time(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> StepTime:
    """Predicted seconds per optimizer step of `layout`, by named term."""
    m = layout.num_microbatches(run.global_batch_size)
    slot, bubble, p2p = _common(model, cluster, run, layout, split)
    dp, opt = _sharded(model, cluster, run, layout, split, slot.total, m)
    return StepTime(
        gemm_s=m * slot.gemm,
        attention_s=m * slot.attention,
        elementwise_s=m * slot.elementwise,
        overhead_s=m * slot.overhead + cluster.efficiency.step_overhead_s,
        bubble_s=bubble,
        tp_comm_s=m * slot.tp,
        cp_comm_s=m * slot.cp,
        moe_comm_s=m * slot.moe,
        pp_comm_s=p2p,
        dp_comm_s=dp,
        optimizer_s=opt,
    )


def _common(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> tuple[Slot, float, float]:
    """Sharding-independent terms: the bottleneck stage's slot, the bubble, pipeline p2p."""
    pp = layout.pp
    slot = _slot(model, cluster, run, layout, split.middle, pp == 1)
    if pp > 1:
        slot = _balanced(model, cluster, run, layout, split)
    if pp > 1 and not layout.loss_balanced:
        slot = max(
            slot,
            _slot(model, cluster, run, layout, split.last, True),
            _slot(model, cluster, run, layout, split.first, False),
            key=lambda s: s.total,
        )
    bubble = (pp - 1) / layout.vpp * slot.total
    if pp > 1 and not layout.loss_balanced:
        bubble = _fill_drain_s(model, cluster, run, layout, split)
    if pp == 1:
        return slot, bubble, 0.0
    m = layout.num_microbatches(run.global_batch_size)
    # megatron-core sends activations in `pipeline_dtype`: fp32 in fp32 runs, else 16-bit.
    act_bytes = 4.0 if run.compute_dtype == "fp32" else 2.0
    msg = layout.micro_batch_size * model.seq_length / layout.cp * model.hidden_size * act_bytes
    gather = 0.0
    if not layout.sequence_parallel and cluster.efficiency.p2p_scatter_gather:
        # 2022 Megatron-LM's scatter_gather_tensors_in_pipeline: each TP rank sends 1/TP of
        # the activation and the receiving stage all-gathers it over NVLink.
        gather = ring_time(cluster, layout.tp, layout.tp, msg)
    msg /= layout.tp if layout.sequence_parallel or gather else 1
    bw, lat = _link(cluster, 2 * layout.tp * layout.cp * layout.dp)
    one = msg / bw + lat + cluster.efficiency.p2p_latency_us * 1e-6 + gather
    # megatron-core overlaps p2p only in the interleaved schedule: the 1F1B schedule without
    # VPP refuses `overlap_p2p_comm` ("Non-interleaved pipeline parallelism does not support
    # overlapping p2p communication"), so there every send/receive waits.
    hidden = cluster.efficiency.p2p_overlap if layout.vpp > 1 else 0.0
    steady = 2.0 * m * layout.vpp * one * (1.0 - hidden)
    tied = _tied_embedding_allreduce_s(model, cluster, run, layout)
    return slot, bubble, 2.0 * (pp - 1) * one + steady + tied


def _fill_drain_s(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> float:
    """The pipeline bubble of stages of unequal time: the first micro-batch's forwards and
    the last one's backwards on every stage but the bottleneck, so the other stages' slots
    (/ vpp), not pp - 1 bottleneck slots (equal when the stages are; PP=2 with the loss on
    the last stage: the first stage's slot, measured on CPU runs, docs/planner.md)."""
    first = _slot(model, cluster, run, layout, split.first, False).total
    last = _slot(model, cluster, run, layout, split.last, True).total
    stages = [first, last] + [_slot(model, cluster, run, layout, split.middle, False).total] * (
        layout.pp - 2
    )
    return (sum(stages) - max(stages)) / layout.vpp


def _tied_embedding_allreduce_s(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout
) -> float:
    """Seconds of the word-embedding gradient all-reduce between the first and the last
    pipeline stage (PP > 1 with tied embeddings: both hold a copy). megatron-core's
    `finalize_model_grads` runs it after the data-parallel gradient sync, on the whole
    main-gradient tensor (`grad_dtype`), with nothing left to hide it behind."""
    if layout.pp == 1 or not model.tied_embeddings or run.freeze_embeddings:
        return 0.0
    nbytes = model.vocab_size * model.hidden_size / layout.tp * BYTES[run.grad_dtype]
    span = (layout.pp - 1) * layout.tp * layout.cp * layout.dp + 1
    return 2.0 * ring_time(cluster, 2, span, nbytes)


def loss_layers_moved(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> int:
    """Layers a loss-balanced layout moves off the last stage (0 unless `loss_balanced`): the
    output layer and loss's time in layers, at least one layer left. `llmctl train` builds
    this split (`config.planning.loss_balanced_stage_layers`)."""
    if not layout.loss_balanced or layout.pp == 1:
        return 0
    last = _slot(model, cluster, run, layout, split.last, True)
    bare = _slot(model, cluster, run, layout, split.last, False)
    per_layer = (bare.total - bare.overhead) / max(1, split.last)
    if not per_layer:
        return 0
    return max(0, min(split.last - 1, int((last.total - bare.total) / per_layer + 0.5)))


def _balanced(
    model: ModelSpec, cluster: ClusterSpec, run: RunSpec, layout: Layout, split: StageSplit
) -> Slot:
    """The bottleneck stage's slot when the loss is balanced like a layer.

    The last stage also computes the output layer and loss. Megatron's
    `pipeline_model_parallel_layout` (used by Megatron-Bridge's performance recipes, e.g.
    Llama-3 70B on H100: the last virtual stage holds one layer) moves k layers off the last
    stage, k = the output layer's time in layers; the k layers land on other stages.
    """
    pp = layout.pp
    mid = _slot(model, cluster, run, layout, split.middle, False)
    first = _slot(model, cluster, run, layout, split.first, False)
    last = _slot(model, cluster, run, layout, split.last, True)
    bare = _slot(model, cluster, run, layout, split.last, False)
    per_layer = (bare.total - bare.overhead) / max(1, split.last)
    k = loss_layers_moved(model, cluster, run, layout, split)
    extra = -(-k // (pp - 1)) * per_layer
    worst = max(last.total - k * per_layer, mid.total + extra, first.total + extra)
    base = mid if mid.total >= first.total else first
    scale = worst / base.total
    return Slot(
        gemm=base.gemm * scale,
        attention=base.attention * scale,
        elementwise=base.elementwise * scale,
        overhead=base.overhead * scale,
        tp=base.tp * scale,
        cp=base.cp * scale,
        moe=base.moe * scale,
    )


def _sharded(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    layout: Layout,
    split: StageSplit,
    slot_s: float,
    m: int,
) -> tuple[float, float]:
    """Seconds of (exposed DP communication, optimizer step) for `layout.optimizer_sharding`."""
    dp = _dp_time(model, cluster, run, layout, split, slot_s, m)
    owned = rank_params(model, layout.tp, layout.pp, layout.ep, split, layout.etp).total
    shard = layout.dp * layout.cp if layout.optimizer_sharding != Sharding.none else 1
    # fp32 master read+write 8, Adam m and v read+write 16, gradient read, parameter write.
    per_param = 24.0 + BYTES[run.grad_dtype] + BYTES[run.params_dtype]
    opt = owned / shard * per_param / (cluster.hbm_bandwidth_gb_s * 1e9)
    return dp, opt


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
    slot, bubble, p2p = _common(model, cluster, run, first, split)
    base = m * slot.total + bubble + p2p + cluster.efficiency.step_overhead_s
    return [base + sum(_sharded(model, cluster, run, lay, split, slot.total, m)) for lay in layouts]


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
