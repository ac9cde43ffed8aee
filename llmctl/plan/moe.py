"""Step-time terms of a mixture-of-experts layer, as megatron-core runs it.

Why a module of its own: a MoE layer is not a dense MLP with more weights. megatron-core's
`MoELayer` (transformer/moe/moe_layer.py) runs, per micro-batch and layer:

- the router (`TopKRouter`): a [tokens, hidden] x [hidden, experts] GEMM, then softmax,
  top-k and the auxiliary load-balancing loss over the [tokens, experts] scores (memory
  bound; `moe_router_fusion` fuses them into one kernel, which still reads and writes the
  scores);
- token permutation (`MoEAlltoAllTokenDispatcher`, moe_utils.permute): the routed copies
  are gathered into expert order before the expert-parallel all-to-all, sorted by local
  expert after it (`sort_chunks_by_idxs`), and both steps are undone in the combine
  (unpermute, weighted by the routing probabilities); the backward moves the same bytes.
  All of it is HBM traffic in the 16-bit activation dtype (FP8 recipes cast inside the
  expert GEMMs);
- the expert-parallel all-to-alls: dispatch and combine forward, their mirrors backward;
- the experts' fc1/fc2 as one grouped GEMM (`TEGroupedMLP`, Transformer Engine's
  GroupedLinear): every local expert's GEMM at its own small M (routed tokens per expert),
  the tiles of all experts sharing the SM waves. The efficiency comes from the same
  shape model as the dense GEMMs (`perf.gemm_s`): wave quantization over `sm_count`
  128x128 tiles and an HBM floor, with no per-row factor.

With `moe_a2a_overlap` (megatron-core `overlap_moe_expert_parallel_comm`, set by
Megatron-Bridge's Qwen3-235B recipes) the all-to-alls of one micro-batch run under the
compute of another (the combined 1F1B schedule), at `efficiency.overlap_cost` of the
hidden part; otherwise they are exposed. It is a user setting (`parallel.moe_a2a_overlap`),
and the search keeps only layouts megatron-core runs it with (`overlap_refusal`).
Expert weights are split over the expert tensor-parallel size (`Layout.etp`, megatron-core's
`expert_tensor_parallel_size`, default TP): each expert GEMM is split over ETP ranks and sees
the routed tokens of those ETP ranks' sequence shares (callers pass tokens * ETP / TP).

Not modelled (docs/planner.md, MoE rows): host-side costs (the dropless dispatcher copies the
per-expert token counts to the host every MoE layer, `_maybe_dtoh_and_synchronize`), the
node-level de-duplication of DeepEP/HybridEP dispatchers, the all-gather of routed tokens over
ETP > 1 ranks, and whatever makes Bridge's Qwen3-30B PP2 EP8 runs 3x slower per token than
these terms (what was ruled out: the rows' `moe_excluded`).
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil

from llmctl.plan.layout import Layout
from llmctl.plan.specs import BYTES, ClusterSpec, ModelSpec, Recompute

#: Output tile of a tensor-core GEMM (rows x columns), as in `perf.gemm_s`.
TILE = 128
#: HBM bytes per router score (fp32), forward + backward: the gating GEMM writes the
#: logits (4), the fused softmax/top-k/aux-loss kernel reads them and writes the
#: probabilities (8); backward reads the probabilities and gradients and writes the
#: logits' gradient (12), and the aux-loss path reads the probabilities again (4).
ROUTER_BYTES_PER_SCORE = 28.0
#: HBM element moves of one MoE layer's token permutation per routed copy and per input
#: token (forward): permute reads each token and writes k copies, the post-all-to-all sort
#: reads and writes each copy, the combine's unsort reads and writes each copy, unpermute
#: reads each copy and writes each token: 6 moves per copy, 2 per token.
PERMUTE_MOVES_PER_COPY = 6.0
PERMUTE_MOVES_PER_TOKEN = 2.0


def grouped_gemm_s(
    cluster: ClusterSpec, dtype: str, groups: int, m: float, n: float, k: float
) -> float:
    """Seconds of `groups` (m x k) @ (k x n) GEMMs launched as one grouped GEMM: the same
    shape model as `perf.gemm_s` (achievable rate after wave quantization, or the HBM
    traffic of the operands), with the tiles of all groups sharing the waves."""
    rate = cluster.tflops(dtype) * 1e12
    if cluster.sm_count:
        tiles = groups * ceil(m / TILE) * ceil(n / TILE)
        waves = ceil(tiles / cluster.sm_count)
        rate *= tiles / (waves * cluster.sm_count)
    traffic = groups * (BYTES[dtype] * (m * k + k * n) + 2.0 * m * n)
    flops = groups * 2.0 * m * n * k
    return max(flops / rate, traffic / (cluster.hbm_bandwidth_gb_s * 1e9))


def _grouped_fwd_bwd(
    cluster: ClusterSpec, dtype: str, groups: int, m: float, n: float, k: float, fwd: float
) -> float:
    """Forward (`fwd` times), data-gradient and weight-gradient grouped GEMMs."""
    return (
        fwd * grouped_gemm_s(cluster, dtype, groups, m, n, k)
        + grouped_gemm_s(cluster, dtype, groups, m, k, n)
        + grouped_gemm_s(cluster, dtype, groups, n, k, m)
    )


def _expert_shape(model: ModelSpec, tokens: float, ep: int) -> tuple[int, float]:
    """(local experts, routed tokens per local expert) of one EP rank's TP group for a
    micro-batch of `tokens` tokens, with the force-balanced routing of the published
    benchmarks (every expert gets tokens * top-k / experts of each rank's tokens)."""
    local = max(1, model.num_experts // ep)
    return local, max(1.0, tokens * model.moe_router_topk / local)


@lru_cache(maxsize=65536)
def expert_gemm_s(
    model: ModelSpec, cluster: ClusterSpec, dtype: str, tokens: float, tp: int, ep: int, fwd: float
) -> float:
    """GEMM seconds of one MoE layer (router + experts' fc1 and fc2) for `tokens` tokens on
    one TP rank, forward (`fwd` times) and backward."""
    h, f = model.hidden_size, model.expert_ffn
    width = 2 if model.gated_mlp else 1
    local, m_e = _expert_shape(model, tokens, ep)
    t = _grouped_fwd_bwd(cluster, dtype, local, m_e, width * f / tp, h, fwd)
    t += _grouped_fwd_bwd(cluster, dtype, local, m_e, h, f / tp, fwd)
    return t + _router_gemm_s(model, cluster, tokens / tp, fwd)


def _router_gemm_s(model: ModelSpec, cluster: ClusterSpec, tokens: float, fwd: float) -> float:
    """The gating GEMM (16-bit: FP8 recipes leave the router unquantized)."""
    return _grouped_fwd_bwd(cluster, "bf16", 1, tokens, model.num_experts, model.hidden_size, fwd)


def memory_s(model: ModelSpec, cluster: ClusterSpec, tokens: float, tp: int, fwd: float) -> float:
    """HBM seconds of one MoE layer's router scores and token (un)permutation for one
    micro-batch on one rank, forward (`fwd` times: full recompute repeats it) + backward.
    With sequence parallelism each TP rank routes its own 1/TP of the tokens."""
    own = tokens / tp
    copies = own * model.moe_router_topk
    moves = PERMUTE_MOVES_PER_COPY * copies + PERMUTE_MOVES_PER_TOKEN * own
    nbytes = (fwd + 1.0) * moves * model.hidden_size * BYTES["bf16"]
    nbytes += (fwd + 1.0) / 2.0 * ROUTER_BYTES_PER_SCORE * own * model.num_experts
    return nbytes / (cluster.hbm_bandwidth_gb_s * 1e9)


def dispatch_bytes(model: ModelSpec, tokens: float, tp: int) -> float:
    """Bytes one rank sends in one all-to-all (dispatch or combine): its routed copies in
    bf16 (the published FP8 recipes dispatch 16-bit activations)."""
    return tokens / tp * model.moe_router_topk * model.hidden_size * BYTES["bf16"]


def layout_refusal(layout: Layout, overlap: bool) -> str | None:
    """Why megatron-core refuses to train a MoE model with `layout` (with `overlap`: also the
    all-to-all overlap), or None. Its MoELayer refuses training with TP > 1 without sequence
    parallelism (transformer/moe/moe_layer.py, "performance may degrade")."""
    if layout.tp > 1 and not layout.sequence_parallel:
        return "MoE with TP > 1 needs sequence parallelism"
    return overlap_refusal(layout) if overlap else None


def overlap_refusal(layout: Layout) -> str | None:
    """Why megatron-core refuses `overlap_moe_expert_parallel_comm` for `layout`, or None.

    Its TransformerConfig asserts expert parallelism (EP > 1), no full recompute, and the
    interleaved schedule (VPP) when PP > 1: the combined 1F1B schedule that overlaps one
    micro-batch's all-to-alls with another's compute exists only there.
    """
    if layout.ep == 1:
        return "moe_a2a_overlap needs EP > 1"
    if layout.recompute == Recompute.full:
        return "moe_a2a_overlap needs recompute other than full"
    if layout.pp > 1 and layout.vpp == 1:
        return "moe_a2a_overlap needs VPP > 1 when PP > 1"
    return None


def ep_span(tp: int, ep: int, etp: int | None = None) -> int:
    """Consecutive ranks one expert-parallel group spans: megatron-core's expert rank order
    (tp-cp-ep-dp-pp with ETP in TP's place) strides EP ranks by ETP (None = TP), so the group
    covers ETP*EP ranks (TP2 EP32 ETP1: 32 ranks, 4 nodes of 8, not 64)."""
    return (etp or tp) * ep


def exposed_a2a_s(a2a: float, window: float, overlap: bool, cost: float) -> float:
    """Seconds the all-to-alls of one layer and micro-batch add: all of them, or with
    `overlap` the part that another micro-batch's `window` seconds of compute do not hide,
    plus `cost` of the hidden part (the all-to-all kernels take SMs and HBM)."""
    if not overlap:
        return a2a
    hidden = min(a2a, window)
    return a2a - hidden + cost * hidden
