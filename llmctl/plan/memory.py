"""Memory per GPU of the worst pipeline stage.

Why these terms (bytes per parameter, Megatron mixed precision with bf16/fp16 parameters):
weights 2, gradients 4 (Megatron accumulates and reduces gradients in fp32 when training in
bf16), optimizer 12 (fp32 master copy, Adam m and v). fp32 parameters: 4 + 4 + 8. The
distributed optimizer shards the optimizer term over the data-parallel-with-context-parallel
group (dp*cp ranks; expert weights over tp*cp*dp/(ep*etp), dp*cp/ep at megatron-core's default
ETP = TP); full sharding (ZeRO-3, Megatron FSDP) also shards weights and gradients and keeps two
layers gathered at a time.

Activations per layer per micro-batch follow Korthikanti et al. 2022 (arXiv 2205.05198, Sec.
4), generalised to GQA, gated MLPs and models without dropout. With s = seq/cp, b = micro-
batch, h = hidden, t = TP, q = heads*head_dim, g*d the key/value width, f the MLP width:

    replicated (split by t only with sequence parallelism)
        norm inputs 4sbh + QKV input 2sbh + fc1 input 2sbh (+ dropout masks 2sbh)
    split by t
        Q, K, V, projection input 4sb(q + g*d); MLP 2sbf + (4 if gated else 2)sbf
    core attention (split by t)
        unfused: (5 with dropout, else 2) * a*b*s*s_full;  flash: 4*a*b*s (softmax stats)

For the GPT shape of the paper (q = h, g*d = h, f = 4h, dropout) this is exactly
sbh(10 + 24/t + 5as/(ht)), and sbh/t * (34 + 5as/h) with sequence parallelism. Selective
recompute drops the core-attention term; full recompute keeps only each layer's input 2sbh.
In-flight micro-batches: 1F1B holds min(pp - r, m) micro-batches on stage r; interleaving
holds (2(pp-r-1) + (v-1)pp + 1) chunk micro-batches, which is pp(1 + (pp-1)/(pp*v)) stage
micro-batches on the first stage (Korthikanti et al. Appendix B). The first stage adds the
embedding dropout mask; the last stage adds the final norm and output-layer inputs (4sbh)
and the fp32 logits kept by the cross entropy (4sbV/t).

FP8 (Transformer Engine) saves the inputs of the four GEMMs (QKV, projection, fc1, fc2) in
fp8 for the backward pass (1 byte instead of 2); other activations stay 16-bit. With 16-bit
weights TE caches an fp8 copy and transpose of each GEMM weight (2 bytes per layer
parameter); with `fp8_param_gather` (Megatron-Bridge's FP8 recipes) the weights themselves
are fp8 (1 byte) and only the transpose of the layer in flight exists. Gradients take
`grad_dtype` bytes (megatron-core's grad buffer: fp32 with grad_reduce_in_fp32, else the
parameter dtype). Fixed overheads
(CUDA context, NCCL buffers) and the allocator fragmentation fraction come from the cluster
config.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llmctl.plan.layout import Layout, StageSplit
from llmctl.plan.lora import lora_stage
from llmctl.plan.params import embedding_params, layer_params, output_params, stage_params
from llmctl.plan.specs import (
    BYTES,
    AttentionKernel,
    ClusterSpec,
    ModelSpec,
    Recompute,
    RunSpec,
    Sharding,
)

GIB = float(1024**3)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Memory of one rank, GiB, by named term."""

    stage: str
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    fp8_buffers_gib: float
    fragmentation_gib: float
    cuda_context_gib: float
    nccl_buffers_gib: float

    @property
    def total_gib(self) -> float:
        """Peak memory of the rank."""
        return sum(self.terms().values())

    def terms(self) -> dict[str, float]:
        """Named terms in a stable order (for tables, bars and JSON)."""
        return {
            "weights": self.weights_gib,
            "grads": self.grads_gib,
            "optimizer": self.optimizer_gib,
            "activations": self.activations_gib,
            "fp8_buffers": self.fp8_buffers_gib,
            "fragmentation": self.fragmentation_gib,
            "cuda_context": self.cuda_context_gib,
            "nccl_buffers": self.nccl_buffers_gib,
        }


def state_bytes(run: RunSpec, sharding: Sharding, shard: int) -> tuple[float, float, float]:
    """Bytes per parameter for (weights, grads, optimizer states) on one rank."""
    mixed = run.params_dtype != "fp32"
    w, g, o = BYTES[run.params_dtype], BYTES[run.grad_dtype], (12.0 if mixed else 8.0)
    if sharding == Sharding.full and run.torch_native:
        # FSDP2 mixed precision: the sharded parameters are the fp32 masters, their sharded
        # gradients fp32 (reduce_dtype), Adam m and v fp32: 16 bytes a parameter over the shard
        return 4.0 / shard, 4.0 / shard, 8.0 / shard
    if sharding == Sharding.full and run.fsdp_wrapper:
        # megatron-core's torch FSDP2 wrapper: no mixed-precision policy, so the gradient
        # shards are in the parameter dtype; megatron's optimizer keeps the fp32 masters
        return w / shard, w / shard, o / shard
    if sharding == Sharding.none:
        return w, g, o
    if sharding == Sharding.distributed:
        return w, g, o / shard
    return w / shard, g / shard, o / shard


@lru_cache(maxsize=65536)
def layer_activation_bytes(
    model: ModelSpec, run: RunSpec, *, tp: int, cp: int, mbs: int, sp: bool, recompute: Recompute
) -> float:
    """Activation bytes one layer keeps for one micro-batch on one rank."""
    s, b, h = model.seq_length / cp, float(mbs), float(model.hidden_size)
    scale = 2.0 if run.compute_dtype == "fp32" else 1.0
    rep_div = tp if sp else 1
    if recompute == Recompute.full:
        return scale * 2.0 * s * b * h / rep_div
    if run.torch_native and recompute == Recompute.selective:
        return scale * _op_sac_bytes(model, s=s, b=b, tp=tp, rep_div=rep_div)
    fused = run.fused_kernels
    unfused_attn = run.attention == AttentionKernel.unfused
    dropout = 2.0 if model.dropout else 0.0
    gin = 1.0 if run.fp8 else 2.0  # bytes of a saved GEMM input
    # Two norms: 16-bit inputs; on the local path also their per-row statistics (torch's
    # LayerNorm keeps mean and rstd in the 16-bit dtype). TE's fp32 statistics (8 bytes a row,
    # 0.1 % of a layer at h = 6144) are left out, as in Korthikanti et al.
    stats = 0.0 if fused else (4.0 if model.layernorm_bias else 2.0)
    replicated = (4.0 + 2.0 * gin + dropout) * s * b * h + 2.0 * stats * s * b
    q = model.num_attention_heads * model.kv_channels
    kv = model.num_query_groups * model.kv_channels
    if unfused_attn and recompute == Recompute.none:
        kv_saved = 4.0 * q  # megatron's DotProductAttention expands GQA keys/values to all heads
    elif unfused_attn and not fused:
        kv_saved = 2.0 * kv + 2.0 * (q + 2.0 * kv)  # checkpointed k; v is a view of the QKV output
    else:
        kv_saved = 4.0 * kv
    split = s * b * ((2.0 + gin) * q + kv_saved)
    width = 4.0 if model.gated_mlp else 2.0
    if model.is_moe:
        f = model.expert_ffn
        split += model.moe_router_topk * (gin * s * b * h + (gin + width) * s * b * f)
    else:
        # unfused SwiGLU (CPU): also the SiLU output and the linear half's copy (4 bytes)
        glu = 4.0 if model.gated_mlp and not fused else 0.0
        split += (gin + width + glu) * s * b * model.ffn_hidden_size
    total = replicated / rep_div + split / tp
    if not fused and model.learned_positions == 0:
        total += 8.0 * s * model.kv_channels  # unfused RoPE: 16-bit cos and sin, for q and k
    if recompute == Recompute.none:
        a = model.num_attention_heads
        if unfused_attn:
            probs = 5.0 if model.dropout else 2.0
            if not fused:  # the unfused softmax keeps its fp32 output (the GEMM a 16-bit copy)
                probs += 4.0 if not model.dropout else 2.0
                total += s * model.seq_length  # the boolean causal mask
            total += probs * a * b * s * model.seq_length / tp
        else:
            total += 4.0 * a * b * s / tp
    return scale * total


def _op_sac_bytes(model: ModelSpec, *, s: float, b: float, tp: int, rep_div: int) -> float:
    """torchtitan's per-op selective checkpointing of one layer: the block input, the
    attention output and its fp32 log-sum-exp, and the outputs of every other matmul in
    forward order (wq, wv, w1, w2 of wq wk wv wo w1 w3 w2); all else is recomputed."""
    h = float(model.hidden_size)
    q = model.num_attention_heads * model.kv_channels
    kv = model.num_query_groups * model.kv_channels
    f = model.expert_ffn if model.is_moe else model.ffn_hidden_size
    replicated = 2.0 * h + 2.0 * h  # block input, w2 output (reduce-scattered with TP)
    split = 2.0 * q + 2.0 * kv + 2.0 * f + 2.0 * q + 4.0 * model.num_attention_heads
    return s * b * (replicated / rep_div + split / tp)


def recompute_working_bytes(
    model: ModelSpec, run: RunSpec, *, tp: int, cp: int, mbs: int, sp: bool, recompute: Recompute
) -> float:
    """Bytes full recompute rebuilds for one layer during backward, alive on top of what the
    stage keeps while that layer's backward runs. Selective recompute rebuilds the core
    attention of one layer after the layer's own MLP activations are freed: no new peak
    (measured: the peak stays within 1 % of the forward's saved bytes)."""
    if recompute != Recompute.full:
        return 0.0
    whole = layer_activation_bytes(
        model, run, tp=tp, cp=cp, mbs=mbs, sp=sp, recompute=Recompute.none
    )
    return whole - layer_activation_bytes(
        model, run, tp=tp, cp=cp, mbs=mbs, sp=sp, recompute=recompute
    )


def in_flight(pp: int, vpp: int, num_microbatches: int, rank: int) -> float:
    """Micro-batches (in units of a whole stage) whose activations stage `rank` holds at peak."""
    if pp == 1:
        return 1.0
    if vpp == 1:
        return float(min(pp - rank, num_microbatches))
    chunks = 2 * (pp - rank - 1) + (vpp - 1) * pp + 1
    return min(float(num_microbatches), chunks / vpp)


def _first_extra(model: ModelSpec, sb: float, div: int) -> float:
    """The token ids the embedding keeps (int64) and the embedding dropout mask."""
    return 8.0 * sb + (sb * model.hidden_size / div if model.dropout else 0.0)


def _last_extra(model: ModelSpec, run: RunSpec, sb: float, div: int, tp: int) -> float:
    """Final norm input and statistics, output-layer input, fp32 logits of the cross entropy,
    int64 labels and its boolean mask."""
    stats = 0.0 if run.fused_kernels else (4.0 if model.layernorm_bias else 2.0)
    return (
        (4.0 * model.hidden_size + stats) * sb / div + 4.0 * sb * model.vocab_size / tp + 9.0 * sb
    )


def activation_bytes(
    model: ModelSpec,
    run: RunSpec,
    layout: Layout,
    *,
    layers: int,
    rank: int,
    num_microbatches: int,
    peak: bool = True,
) -> float:
    """Activation bytes of pipeline stage `rank` holding `layers` layers: at peak (the
    micro-batches in flight, plus one recomputed layer during backward), or with
    `peak=False` what one micro-batch's forward keeps on the stage (tensors shared by all
    micro-batches counted once per step, spread over them)."""
    return _activation_bytes(
        model,
        run,
        layout.tp,
        layout.cp,
        layout.micro_batch_size,
        layout.sequence_parallel,
        layout.recompute,
        layout.pp,
        layout.vpp,
        layers,
        rank,
        num_microbatches,
        peak,
    )


@lru_cache(maxsize=65536)
def _activation_bytes(
    model: ModelSpec,
    run: RunSpec,
    tp: int,
    cp: int,
    mbs: int,
    sp: bool,
    rc: Recompute,
    pp: int,
    vpp: int,
    layers: int,
    rank: int,
    num_microbatches: int,
    peak: bool,
) -> float:
    first, last = rank == 0, rank == pp - 1
    per_layer = layer_activation_bytes(model, run, tp=tp, cp=cp, mbs=mbs, sp=sp, recompute=rc)
    held = in_flight(pp, vpp, num_microbatches, rank) if peak else 1.0
    acts = per_layer * layers * held
    sb = model.seq_length / cp * mbs
    if first:
        acts += _first_extra(model, sb, tp if sp else 1) * held
    if rc == Recompute.full and model.learned_positions == 0:
        freqs = 4.0 * model.seq_length / cp * model.kv_channels  # fp32, shared
        acts += freqs if peak else freqs / num_microbatches
    loss = _last_extra(model, run, sb, tp if sp else 1, tp) if last else 0.0
    if not peak:
        return acts + loss
    if last and run.torch_native:
        # torch's cross entropy backward: the log-softmax's input and output gradients (fp32)
        # next to its saved fp32 output
        loss += 8.0 * sb * model.vocab_size / tp
    # During backward one recomputed layer is alive on top of the kept inputs; by then the
    # last stage has freed its loss activations.
    working = recompute_working_bytes(model, run, tp=tp, cp=cp, mbs=mbs, sp=sp, recompute=rc)
    return acts + max(loss, working)


@dataclass(frozen=True, slots=True)
class _Stage:
    """Sharding-independent part of a stage."""

    dense: float
    expert: float
    layer: int
    """Parameters of one layer on the rank (an FSDP unit)."""
    layers: int
    acts: float
    frozen: float
    edge: float
    """Parameters of the stage's embedding or output layer (its own FSDP unit), 0 if none."""
    embed: float = 0.0
    """Parameters of the stage's input embedding (first stage), 0 if none."""
    root: float = 0.0
    """Parameters of the stage's final norm and output layer (last stage), 0 if none."""


def _static(
    model: ModelSpec, run: RunSpec, layout: Layout, split: StageSplit, m: int, rank: int
) -> _Stage:
    pp = layout.pp
    first, last = rank == 0, rank == pp - 1
    layers = split.first if first else (split.last if last else split.middle)
    params = stage_params(
        model,
        tp=layout.tp,
        pp=pp,
        ep=layout.ep,
        layers=layers,
        first=first,
        last=last,
        etp=layout.etp,
    )
    acts = activation_bytes(model, run, layout, layers=layers, rank=rank, num_microbatches=m)
    lp = layer_params(model, layout.tp, layout.ep, layout.etp).total
    frozen = embedding_params(model, layout.tp) if first and run.freeze_embeddings else 0
    embed = embedding_params(model, layout.tp) if first else 0
    root = output_params(model, layout.tp, pp) if last else 0
    edge = max(embed, root)
    dense, frozen_all = lora_stage(model, run, layout.tp, layers, params.dense, frozen)  # LoRA
    return _Stage(
        dense=float(dense),
        expert=float(params.expert),
        layer=lp,
        layers=layers,
        acts=acts,
        frozen=float(frozen_all),
        edge=float(edge),
        embed=float(embed),
        root=float(root),
    )


def gathered_bytes(run: RunSpec, st: _Stage, pp: int) -> tuple[float, float]:
    """Unsharded (weights, grads) bytes that full sharding holds on top of the shards.

    Megatron FSDP (megatron-core): the unit being computed and the one prefetched, each with
    its weights (16-bit, or FP8 with `fp8_param_gather`) and its unsharded gradient in the
    grad dtype. The largest pair is a layer with the embedding or output layer when the stage
    holds one (the start of backward on the last stage, its end on the first).
    PyTorch FSDP2 (`torch_native`, torchtitan): the same two units of 16-bit weights, the
    16-bit gradient of the unit in backward and its fp32 copy for the reduce-scatter
    (`reduce_dtype` fp32); with PP > 1 torchtitan does not reshard after forward, so the whole
    stage stays gathered and its 16-bit gradients accumulate unsharded over micro-batches.
    megatron-core's torch FSDP2 wrapper (`fsdp_wrapper`, `llmctl train`): the final norm and
    output layer are not a unit of their own but the root's, gathered through forward and
    backward with their gradient; on top, the layer in backward and the one it prefetches
    (or the embedding), and the gradient of one unit, all in the parameter dtype (the CPU
    memory oracle measures these exactly).
    """
    wbytes = 1.0 if run.fp8 and run.fp8_param_gather else BYTES[run.params_dtype]
    if run.fsdp_wrapper and not run.torch_native:
        pbytes = BYTES[run.params_dtype]
        weights = max(2 * st.layer, st.layer + st.embed) + st.root
        return weights * wbytes, (max(st.layer, st.embed) + st.root) * pbytes
    pair = st.layer + max(st.layer, st.edge)
    if not run.torch_native:
        return pair * wbytes, pair * BYTES[run.grad_dtype]
    gbytes = BYTES[run.params_dtype]
    if pp > 1:
        whole = st.dense + st.expert
        return whole * wbytes, whole * gbytes + max(st.layer, st.edge) * 4.0
    return pair * wbytes, max(st.layer, st.edge) * (gbytes + 4.0)


def _states(
    run: RunSpec,
    sharding: Sharding,
    st: _Stage,
    shard: int,
    expert_shard: int,
    pp: int = 1,
) -> tuple[float, float, float, float]:
    """Bytes of (weights, grads, optimizer, fp8 buffers) for one sharding choice; expert
    states shard over the expert data-parallel group (`Layout.expert_dp`)."""
    per = state_bytes(run, sharding, shard), state_bytes(run, sharding, expert_shard)
    return _states_with(run, sharding, st, shard, per, pp)


def _states_with(
    run: RunSpec,
    sharding: Sharding,
    st: _Stage,
    shard: int,
    per: tuple[tuple[float, float, float], tuple[float, float, float]],
    pp: int,
) -> tuple[float, float, float, float]:
    """`_states` with the bytes per parameter (dense, expert) already looked up."""
    (wd, gd, od), (we, ge, oe) = per
    weights = st.dense * wd + st.expert * we
    grads = st.dense * gd + st.expert * ge
    optimizer = st.dense * od + st.expert * oe
    grads -= st.frozen * gd  # train.freeze_embeddings: frozen params keep weights only
    optimizer -= st.frozen * od
    if sharding == Sharding.full:
        gw, gg = gathered_bytes(run, st, pp)
        weights += gw
        grads += gg
    lp, layers = st.layer, st.layers
    return (
        weights - _fp8_weight_saving(run, sharding, lp * layers, shard),
        grads,
        optimizer,
        (_fp8_buffers(run, sharding, lp, layers)),
    )


def _fp8_weight_saving(run: RunSpec, sharding: Sharding, layer_params: float, shard: int) -> float:
    """Bytes saved when GEMM weights are kept in FP8 (`fp8_param_gather`) instead of 16-bit."""
    if not (run.fp8 and run.fp8_param_gather):
        return 0.0
    saved = layer_params * (BYTES[run.params_dtype] - 1.0)
    return saved / shard if sharding == Sharding.full else saved


def _fp8_buffers(run: RunSpec, sharding: Sharding, lp: float, layers: int) -> float:
    """Transformer Engine's FP8 weight copies: with 16-bit weights it caches an FP8 copy and
    its transpose of every GEMM weight across micro-batches (2 bytes per layer parameter);
    with FP8 weights (`fp8_param_gather`) only the transpose of the layer being computed is
    alive (megatron-core's default `keep_fp8_transpose_cache=False`), counted as two layers."""
    if not run.fp8:
        return 0.0
    if run.fp8_param_gather:
        return 2.0 * lp
    return 2.0 * (2 if sharding == Sharding.full else layers) * lp


def stage_terms(
    model: ModelSpec,
    run: RunSpec,
    layout: Layout,
    *,
    split: StageSplit,
    num_microbatches: int,
    rank: int,
) -> tuple[float, float, float, float, float]:
    """Bytes of (weights, grads, optimizer, activations, fp8 buffers) on stage `rank`."""
    static = _static(model, run, layout, split, num_microbatches, rank)
    shard = layout.dp * layout.cp
    w, g, o, f = _states(run, layout.optimizer_sharding, static, shard, layout.expert_dp, layout.pp)
    return w, g, o, static.acts, f


def peak_gib_options(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    layout: Layout,
    shardings: list[Sharding],
    *,
    split: StageSplit,
    num_microbatches: int,
) -> list[float]:
    """Worst-stage GiB of `layout` for each sharding choice (the search's fast path)."""
    statics = [_static(model, run, layout, split, num_microbatches, r) for r in _ranks(layout.pp)]
    shard, scale = layout.dp * layout.cp, (1.0 + cluster.fragmentation_fraction) / GIB
    fixed = cluster.cuda_context_gib + cluster.nccl_buffer_gib
    out = []
    for sh in shardings:
        per = state_bytes(run, sh, shard), state_bytes(run, sh, layout.expert_dp)
        worst = max(
            sum(_states_with(run, sh, st, shard, per, layout.pp)) + st.acts for st in statics
        )
        out.append(worst * scale + fixed)
    return out


def _ranks(pp: int) -> tuple[int, ...]:
    return tuple(sorted({0, min(1, pp - 1), pp - 1}))


def stage_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    layout: Layout,
    *,
    split: StageSplit,
    num_microbatches: int,
    rank: int,
) -> MemoryBreakdown:
    """Memory of pipeline stage `rank` (0 = first, pp-1 = last), by named term."""
    pp = layout.pp
    w, g, o, a, f = stage_terms(
        model, run, layout, split=split, num_microbatches=num_microbatches, rank=rank
    )
    stage = (
        "only" if pp == 1 else ("first" if rank == 0 else ("last" if rank == pp - 1 else "middle"))
    )
    return MemoryBreakdown(
        stage=stage,
        weights_gib=w / GIB,
        grads_gib=g / GIB,
        optimizer_gib=o / GIB,
        activations_gib=a / GIB,
        fp8_buffers_gib=f / GIB,
        fragmentation_gib=(w + g + o + a + f) * cluster.fragmentation_fraction / GIB,
        cuda_context_gib=cluster.cuda_context_gib,
        nccl_buffers_gib=cluster.nccl_buffer_gib,
    )


def peak_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    run: RunSpec,
    layout: Layout,
    *,
    split: StageSplit,
    num_microbatches: int,
) -> MemoryBreakdown:
    """Memory of the worst rank among the first, second and last pipeline stages."""
    stages = [
        stage_memory(
            model, cluster, run, layout, split=split, num_microbatches=num_microbatches, rank=r
        )
        for r in _ranks(layout.pp)
    ]
    return max(stages, key=lambda m: m.total_gib)
