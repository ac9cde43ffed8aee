"""LoRA in the memory model (`train.peft=lora`): a frozen base plus small trained adapters.

Every base parameter keeps its weight bytes but has no gradient buffer and no optimizer state
(megatron-core's DDP and optimizer skip parameters without `requires_grad`); each adapter
parameter has all three. Adapters per layer on one TP rank, for a target with `in` x `out`
features and rank r: column-parallel targets (q, k, v, gate, up) hold A whole (r * in) and
B's rows (out / tp * r); row-parallel ones (o, down) hold A's input columns (r * in / tp) and
B whole (out * r) (llmctl.train.lora). The adapters' activations (r values per token and target)
are not counted: under 1 % of a layer's at r <= 64.
"""

from __future__ import annotations

from llmctl.plan.specs import ModelSpec, RunSpec

_ROW = ("o_proj", "down_proj")


def target_dims(
    hidden: int, ffn: int, kv_channels: int, heads: int, groups: int, target: str
) -> tuple[int, int]:
    """(in, out) features of the Hugging Face linear `target` (q_proj ... down_proj) of a
    layer, unsharded; shared by the planner and the trainer's adapters."""
    q, kv = heads * kv_channels, groups * kv_channels
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, ffn),
        "up_proj": (hidden, ffn),
        "down_proj": (ffn, hidden),
    }[target]


def _in_out(model: ModelSpec, target: str) -> tuple[int, int]:
    f = model.expert_ffn if model.is_moe else model.ffn_hidden_size
    return target_dims(
        model.hidden_size, f, model.kv_channels, model.num_attention_heads,
        model.num_query_groups, target,
    )  # fmt: skip


def adapter_params_per_layer(model: ModelSpec, run: RunSpec, tp: int = 1) -> int:
    """Adapter parameters of one layer on one TP rank (0 without LoRA)."""
    r = run.lora_rank
    if r <= 0:
        return 0
    total = 0
    for target in run.lora_targets:
        inp, out = _in_out(model, target)
        total += r * inp // tp + out * r if target in _ROW else r * inp + out // tp * r
    return total


def lora_stage(
    model: ModelSpec, run: RunSpec, tp: int, layers: int, dense: float, frozen: float
) -> tuple[float, float]:
    """(dense params, frozen params) of a stage with LoRA: the adapters join the dense
    parameters, and every base parameter is frozen; unchanged without LoRA."""
    if run.lora_rank <= 0:
        return dense, frozen
    return dense + adapter_params_per_layer(model, run, tp) * layers, dense
