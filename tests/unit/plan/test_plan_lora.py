"""The planner sizes LoRA runs (issue 20, item 5): frozen base, adapters with full state.

With `train.peft=lora` every base parameter keeps its weight bytes and loses its gradient and
optimizer bytes; the adapters add all three (llmctl.plan.lora). The adapter count the planner
uses equals the parameters llmctl.train.lora creates on each TP rank.
"""

from __future__ import annotations

import pytest

from llmctl.config import compose
from llmctl.plan.layout import Layout, split_layers
from llmctl.plan.lora import adapter_params_per_layer
from llmctl.plan.memory import GIB, stage_memory
from llmctl.plan.specs import BYTES, Sharding
from llmctl.run.planning import plan_input

ALL = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
LORA = ["train.peft=lora", "train.lora.rank=16", f"train.lora.target_modules={ALL}",
        "checkpoint.init_from=/models/base"]  # fmt: skip


def _memory(inp, layout: Layout, rank: int):
    split = split_layers(inp.model.num_layers, layout.pp, layout.vpp, False)
    assert split is not None
    return stage_memory(
        inp.model, inp.cluster, inp.run, layout, split=split, num_microbatches=8, rank=rank
    )


@pytest.mark.parametrize("sharding", [Sharding.none, Sharding.distributed])
def test_lora_keeps_weights_and_trains_only_adapter_state(sharding):
    full = plan_input(compose("llama3_8b_pretrain_8gpu_h100_fp8", ["precision=bf16"]))
    lora = plan_input(compose("llama3_8b_pretrain_8gpu_h100_fp8", ["precision=bf16", *LORA]))
    assert lora.run.lora_rank == 16 and len(lora.run.lora_targets) == 7
    layout = Layout(tp=2, pp=2, dp=2, micro_batch_size=1, optimizer_sharding=sharding)
    shard = layout.dp if sharding == Sharding.distributed else 1
    layers = lora.model.num_layers // layout.pp
    n = adapter_params_per_layer(lora.model, lora.run, layout.tp) * layers
    for rank in (0, 1):
        f, m = _memory(full, layout, rank), _memory(lora, layout, rank)
        assert m.weights_gib - f.weights_gib == pytest.approx(n * BYTES["bf16"] / GIB)
        assert m.grads_gib == pytest.approx(n * BYTES[lora.run.grad_dtype] / GIB)
        assert m.optimizer_gib == pytest.approx(n * 12 / shard / GIB)
        assert m.activations_gib == f.activations_gib
        assert m.total_gib < f.total_gib - 0.9 * (f.grads_gib + f.optimizer_gib)
    print(
        f"measured: llama3-8b TP2 PP2 DP2 ({sharding.value}) first stage "
        f"{_memory(full, layout, 0).total_gib:.1f} GiB full vs "
        f"{_memory(lora, layout, 0).total_gib:.1f} GiB LoRA r=16 ({n:,} adapter params)"
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_adapter_count_is_what_the_runner_creates(tp):
    pytest.importorskip("torch")
    from llmctl.train.lora import TARGETS, _init_pair

    cfg = compose("tiny_cpu", [*LORA, "train.lora.rank=4"])
    inp = plan_input(cfg)
    made = {
        r: sum(
            a.numel() + b.numel()
            for name in TARGETS
            for a, b in [_init_pair(cfg.model, name, 4, 1, 1, tp, r)]
        )
        for r in range(tp)
    }
    assert set(made.values()) == {adapter_params_per_layer(inp.model, inp.run, tp)}


def test_lora_bad_targets_are_one_line():
    from llmctl.errors import UserError

    with pytest.raises(UserError, match="'qkv' is not a module of this model"):
        compose("tiny_cpu", [*LORA, "train.lora.target_modules=[q_proj,qkv]"])
    with pytest.raises(UserError, match="'gate_proj' is not a module of this model"):
        compose(
            "tiny_cpu", [*LORA, "model.activation=gelu", "train.lora.target_modules=[gate_proj]"]
        )
    with pytest.raises(UserError, match="needs the base model"):
        compose("tiny_cpu", ["train.peft=lora"])
