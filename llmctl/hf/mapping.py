"""One table of names and shapes between Hugging Face causal LMs and megatron-core's GPTModel.

Both directions use it: `llmctl import hf` (Hugging Face -> megatron) and `llmctl export hf`
(megatron -> Hugging Face). Megatron names are those of GPTModel's local layer spec at TP=1
(`decoder.layers.{i}.self_attention.linear_qkv.weight`, ...); Hugging Face names are those of
`save_pretrained` (`model.layers.{i}.self_attn.q_proj.weight`, ...).

Three operations cover every tensor of the four families:

- COPY: same tensor, new name.
- QKV: megatron fuses Q, K and V per query group: for each of the G groups, its H/G query
  heads, then one key head, then one value head (each `head_dim` rows). Hugging Face keeps Q, K
  and V apart with query head i reading key/value head i // (H/G), which is the same grouping.
  Biases (Qwen2) follow the same row order.
- GATE_UP: megatron's SwiGLU `linear_fc1` holds [gate; up] stacked along rows; Hugging Face has
  `gate_proj`/`up_proj` (Mixtral experts: `w1`/`w3`).

RoPE needs no permutation: megatron's default (non-interleaved halves, rotary_percent 1) is the
`rotate_half` convention of these Hugging Face models. Functions here take and return torch
tensors but import nothing heavy at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmctl.config.schema import ModelConfig


class Op(StrEnum):
    """How one megatron tensor is made from its Hugging Face tensors (and back)."""

    copy = "copy"
    qkv = "qkv"
    gate_up = "gate_up"


@dataclass(frozen=True, slots=True)
class Rule:
    """One megatron tensor and the Hugging Face tensors it is made of.

    Names hold `{i}` (layer) and `{e}` (expert) placeholders.
    """

    megatron: str
    hf: tuple[str, ...]
    op: Op = Op.copy

    def names(self, i: int = 0, e: int = 0) -> tuple[str, tuple[str, ...]]:
        """(megatron name, Hugging Face names) with the placeholders filled in."""
        return self.megatron.format(i=i, e=e), tuple(n.format(i=i, e=e) for n in self.hf)


@dataclass(frozen=True, slots=True)
class Family:
    """A Hugging Face architecture that megatron-core's GPTModel can express."""

    architecture: str
    model_type: str
    qkv_bias: bool = False
    moe: bool = False


FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama"),
        Family("MistralForCausalLM", "mistral"),
        Family("Qwen2ForCausalLM", "qwen2", qkv_bias=True),
        Family("MixtralForCausalLM", "mixtral", moe=True),
    )
}

_L = "decoder.layers.{i}."
_H = "model.layers.{i}."
ATTENTION: tuple[Rule, ...] = (
    Rule(_L + "input_layernorm.weight", (_H + "input_layernorm.weight",)),
    Rule(
        _L + "self_attention.linear_qkv.weight",
        tuple(f"{_H}self_attn.{p}_proj.weight" for p in "qkv"),
        Op.qkv,
    ),
    Rule(_L + "self_attention.linear_proj.weight", (_H + "self_attn.o_proj.weight",)),
    Rule(_L + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",)),
)
QKV_BIAS = Rule(
    _L + "self_attention.linear_qkv.bias",
    tuple(f"{_H}self_attn.{p}_proj.bias" for p in "qkv"),
    Op.qkv,
)
DENSE_MLP: tuple[Rule, ...] = (
    Rule(_L + "mlp.linear_fc1.weight", (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"),
         Op.gate_up),
    Rule(_L + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",)),
)  # fmt: skip
_X = _H + "block_sparse_moe."
ROUTER = Rule(_L + "mlp.router.weight", (_X + "gate.weight",))
EXPERT: tuple[Rule, ...] = (
    Rule(
        _L + "mlp.experts.local_experts.{e}.linear_fc1.weight",
        (_X + "experts.{e}.w1.weight", _X + "experts.{e}.w3.weight"),
        Op.gate_up,
    ),
    Rule(_L + "mlp.experts.local_experts.{e}.linear_fc2.weight", (_X + "experts.{e}.w2.weight",)),
)
EMBEDDING = Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",))
FINAL_NORM = Rule("decoder.final_layernorm.weight", ("model.norm.weight",))
OUTPUT = Rule("output_layer.weight", ("lm_head.weight",))


def layer_rules(family: Family) -> list[Rule]:
    """Per-layer rules of a family (expert rules carry `{e}`)."""
    rules = [*ATTENTION]
    if family.qkv_bias:
        rules.insert(2, QKV_BIAS)
    rules += [ROUTER, *EXPERT] if family.moe else [*DENSE_MLP]
    return rules


def top_rules(tied: bool) -> list[Rule]:
    """Rules outside the decoder layers (no output layer when embeddings are tied)."""
    return [EMBEDDING, FINAL_NORM] + ([] if tied else [OUTPUT])


def expand(
    family: Family, num_layers: int, num_experts: int, tied: bool
) -> list[tuple[str, tuple[str, ...], Op]]:
    """Every (megatron name, Hugging Face names, op) of a model, top-level rules first."""
    out = [(*r.names(), r.op) for r in top_rules(tied)]
    for i in range(num_layers):
        for rule in layer_rules(family):
            experts = range(num_experts) if "{e}" in rule.megatron else range(1)
            out += [(*rule.names(i, e), rule.op) for e in experts]
    return out  # fmt: skip


@dataclass(frozen=True, slots=True)
class Heads:
    """Attention shape the QKV fusion needs."""

    num_heads: int
    num_groups: int
    head_dim: int


def head_dim(model: ModelConfig) -> int:
    """Rows per attention head: `kv_channels`, or hidden size over heads."""
    return int(model.kv_channels or model.hidden_size // model.num_attention_heads)


def heads_of(model: ModelConfig) -> Heads:
    """Attention shape of `cfg.model` for the QKV fusion."""
    return Heads(model.num_attention_heads, model.num_query_groups, head_dim(model))


def fuse_qkv(q: Any, k: Any, v: Any, heads: Heads) -> Any:
    """Megatron's group-interleaved QKV (weight [rows, hidden] or bias [rows]) from Q, K, V."""
    import torch

    g, d = heads.num_groups, heads.head_dim
    per = heads.num_heads // g
    rest = q.shape[1:]
    parts = (q.reshape(g, per, d, *rest), k.reshape(g, 1, d, *rest), v.reshape(g, 1, d, *rest))
    return torch.cat(parts, dim=1).reshape(g * (per + 2) * d, *rest)


def split_qkv(qkv: Any, heads: Heads) -> tuple[Any, Any, Any]:
    """Q, K, V from megatron's group-interleaved fused QKV (weight or bias)."""
    g, d = heads.num_groups, heads.head_dim
    per = heads.num_heads // g
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, per + 2, d, *rest)
    q = grouped[:, :per].reshape(g * per * d, *rest)
    k = grouped[:, per].reshape(g * d, *rest)
    v = grouped[:, per + 1].reshape(g * d, *rest)
    return q, k, v


def to_megatron(op: Op, tensors: list[Any], heads: Heads) -> Any:
    """The megatron tensor from its Hugging Face tensors (in the rule's order)."""
    import torch

    if op == Op.qkv:
        q, k, v = tensors
        return fuse_qkv(q, k, v, heads)
    if op == Op.gate_up:
        return torch.cat(tensors, dim=0)
    return tensors[0]


def to_hf(op: Op, tensor: Any, heads: Heads) -> list[Any]:
    """The Hugging Face tensors (in the rule's order) from one megatron tensor."""
    if op == Op.qkv:
        return list(split_qkv(tensor, heads))
    if op == Op.gate_up:
        return list(tensor.chunk(2, dim=0))
    return [tensor]


# Names under which a torch_dist checkpoint stores what the local spec calls otherwise: the
# sharded keys follow Transformer Engine's fused modules, and SequentialMLP stacks its experts.
CHECKPOINT_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
_STACKED_EXPERTS = "mlp.experts.experts."


def local_names(suffix: str, tensor: Any) -> list[tuple[str, Any]]:
    """(local-spec suffix, tensor) pairs of one layer's checkpoint entry (experts unstacked)."""
    suffix = CHECKPOINT_ALIASES.get(suffix, suffix)
    if suffix.startswith(_STACKED_EXPERTS):
        rest = suffix[len(_STACKED_EXPERTS) :]
        return [
            (f"mlp.experts.local_experts.{e}.{rest}", tensor[e]) for e in range(tensor.shape[0])
        ]
    return [(suffix, tensor)]


def _layers(state: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Full local names (`decoder.layers.{i}.x`) from stacked ([L, ...]) or numbered keys."""
    out: dict[str, Any] = {}
    for key, tensor in state.items():
        if not key.startswith("decoder.layers."):
            out[key] = tensor
            continue
        rest = key[len("decoder.layers.") :]
        head, _, tail = rest.partition(".")
        if head.isdigit():
            per_layer = [(int(head), tail, tensor)]
        elif tensor.shape[0] != num_layers:
            raise ValueError(f"{key}: {tensor.shape[0]} stacked layers, config says {num_layers}")
        else:
            per_layer = [(i, rest, tensor[i]) for i in range(num_layers)]
        for i, suffix, t in per_layer:
            for name, part in local_names(suffix, t):
                out[f"decoder.layers.{i}.{name}"] = part
    return out


def megatron_to_hf(state: dict[str, Any], family: Family, model: ModelConfig) -> dict[str, Any]:
    """Hugging Face state dict (contiguous tensors) from a checkpoint's global model tensors.

    Vocab rows past `model.hf_vocab_size` (padding) are dropped.

    Raises:
        KeyError: A tensor with no counterpart, or one the family needs that is missing
            (the message names it).
    """
    heads = heads_of(model)
    local = _layers(state, model.num_layers)
    table = expand(family, model.num_layers, model.num_experts, bool(model.tied_embeddings))
    vocab = getattr(model, "hf_vocab_size", None) or model.vocab_size
    out: dict[str, Any] = {}
    for name, hf_names, op in table:
        if name not in local:
            raise KeyError(f"checkpoint has no {name} (needed for {hf_names[0]})")
        tensor = local.pop(name)
        if name in (EMBEDDING.megatron, OUTPUT.megatron):
            tensor = tensor[:vocab]
        out |= dict(zip(hf_names, to_hf(op, tensor, heads), strict=True))
    if local:
        raise KeyError(
            f"checkpoint tensor {sorted(local)[0]} has no {family.architecture} counterpart"
        )
    return {k: v.contiguous() for k, v in out.items()}
