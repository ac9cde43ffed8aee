"""Model FLOPs with Megatron's accounting.

Why this accounting: throughput tables (Megatron-LM's `num_floating_point_operations`,
Megatron-Bridge's performance summary) report "model TFLOP/s" with it, so using the same
formula makes our numbers comparable with theirs. Per token, forward + backward (factor 3)
of each GEMM (2 FLOPs per multiply-add):

    attention   6 * (h*(q + 2*g*d) + q*h) + 6 * q * s      (causal: half of the s*s scores)
    MLP         6 * h * f * (3 if gated else 2)            (MoE: times top-k, expert f)
    logits      6 * h * V

with q = heads*d, g = query groups. `causal=False` gives the older (Narayanan et al. 2021,
Korthikanti et al. 2022) convention, 12*q*s for the scores. Recompute adds hardware FLOPs,
not model FLOPs: full recompute one more forward of every layer, selective one more forward
of the core attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from llmctl.plan.specs import ModelSpec, Recompute


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenFlops:
    """FLOPs per token (forward + backward), split by kernel kind."""

    layer_gemm: float
    layer_core_attention: float
    logits: float
    num_layers: int

    @property
    def layer(self) -> float:
        """One transformer layer."""
        return self.layer_gemm + self.layer_core_attention

    @property
    def total(self) -> float:
        """The whole model."""
        return self.num_layers * self.layer + self.logits


@lru_cache(maxsize=256)
def token_flops(model: ModelSpec, *, causal: bool = True) -> TokenFlops:
    """Model FLOPs per token of a training step (forward + backward)."""
    h, d = model.hidden_size, model.kv_channels
    q, kv = model.num_attention_heads * d, 2 * model.num_query_groups * d
    proj = h * (q + kv) + q * h
    width = 3 if model.gated_mlp else 2
    if model.is_moe:
        mlp = h * model.expert_ffn * width * model.moe_router_topk
    else:
        mlp = h * model.ffn_hidden_size * width
    core = (6 if causal else 12) * q * model.seq_length
    return TokenFlops(
        layer_gemm=6.0 * (proj + mlp),
        layer_core_attention=float(core),
        logits=6.0 * h * model.vocab_size,
        num_layers=model.num_layers,
    )


def step_flops(model: ModelSpec, global_batch_size: int, *, causal: bool = True) -> float:
    """Model FLOPs of one optimizer step (Megatron's `num_floating_point_operations`)."""
    return global_batch_size * model.seq_length * token_flops(model, causal=causal).total


def recompute_factor(flops: TokenFlops, recompute: Recompute) -> tuple[float, float]:
    """Multipliers (GEMM, core attention) of the layer FLOPs actually executed."""
    if recompute == Recompute.full:
        return 4.0 / 3.0, 4.0 / 3.0
    if recompute == Recompute.selective:
        return 1.0, 4.0 / 3.0
    return 1.0, 1.0
