"""Exact parameter counts, whole model and per pipeline stage per tensor-parallel rank.

Why exact: the memory model multiplies these counts by 16-18 bytes, so an error here is an
error everywhere. The counts follow megatron-core's GPTModel with the local layer spec (the
test suite checks them against a real GPTModel): per layer two norms (weight, plus bias for
LayerNorm), fused QKV and output projection, fc1 (twice as wide for gated MLPs) and fc2.
Column-parallel weights and biases are split over TP; row-parallel biases and norms are
replicated. The word embedding and output layer are split over TP (vocab-parallel).
MoE layers hold a router (replicated) and `num_experts / ep` experts split over the expert
tensor-parallel size (megatron-core's default: TP).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llmctl.plan.specs import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParams:
    """Parameters of one transformer layer on one TP rank, split by what shards them."""

    dense: int
    expert: int

    @property
    def total(self) -> int:
        """All parameters of the layer on the rank."""
        return self.dense + self.expert


def _norm(model: ModelSpec) -> int:
    return model.hidden_size * (2 if model.layernorm_bias else 1)


@lru_cache(maxsize=4096)
def layer_params(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int | None = None) -> LayerParams:
    """Parameters of one layer held by one rank with tensor-parallel size `tp` (experts split
    over the expert tensor-parallel size `etp`, None = `tp`)."""
    h, d = model.hidden_size, model.kv_channels
    q, kv = model.num_attention_heads * d, 2 * model.num_query_groups * d
    bias = model.add_bias_linear
    attn = (h * (q + kv) + (q + kv) * bias + q * h) // tp + h * bias
    dense = 2 * _norm(model) + attn
    width = 2 if model.gated_mlp else 1
    if not model.is_moe:
        f = model.ffn_hidden_size
        dense += (h * f * width + f * width * bias + f * h) // tp + h * bias
        return LayerParams(dense=dense, expert=0)
    f = model.expert_ffn
    one_expert = (h * f * width + f * width * bias + f * h) // (etp or tp) + h * bias
    dense += h * model.num_experts
    return LayerParams(dense=dense, expert=one_expert * (model.num_experts // ep))


@lru_cache(maxsize=4096)
def embedding_params(model: ModelSpec, tp: int = 1) -> int:
    """Word (vocab-parallel) and learned position embeddings on the first stage."""
    return model.vocab_size * model.hidden_size // tp + model.learned_positions * model.hidden_size


@lru_cache(maxsize=4096)
def output_params(model: ModelSpec, tp: int = 1, pp: int = 1) -> int:
    """Final norm and output layer on the last stage.

    With tied embeddings the output layer reuses the word embedding; with PP > 1 the last
    stage still holds its own copy (kept in sync by an all-reduce), as Megatron does.
    """
    out = model.vocab_size * model.hidden_size // tp
    if model.tied_embeddings and pp == 1:
        out = 0
    return _norm(model) + out


def total_params(model: ModelSpec) -> int:
    """Parameters of the whole model (TP=PP=1)."""
    lp = layer_params(model)
    return model.num_layers * lp.total + embedding_params(model) + output_params(model)


def stage_params(
    model: ModelSpec,
    *,
    tp: int,
    pp: int,
    ep: int,
    layers: int,
    first: bool,
    last: bool,
    etp: int | None = None,
) -> LayerParams:
    """Parameters on one rank of a stage with `layers` transformer layers."""
    lp = layer_params(model, tp, ep, etp)
    dense = layers * lp.dense
    if first:
        dense += embedding_params(model, tp)
    if last:
        dense += output_params(model, tp, pp)
    return LayerParams(dense=dense, expert=layers * lp.expert)
