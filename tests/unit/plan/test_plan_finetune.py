"""The planner sizes fine-tuning runs (issue 13, item 7): frozen embeddings and packed lengths.

Frozen embeddings keep their weights but get no gradient and no optimizer state (megatron's
DDP gives frozen parameters no grad buffer and its optimizer skips them; the training test
`test_freeze_embeddings_*` checks that on the real model, and that the frozen count equals the
planner's embedding count). The sequence length of SFT packs comes from their manifest.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmctl.config import compose
from llmctl.plan.layout import Layout, split_layers
from llmctl.plan.memory import GIB, stage_memory
from llmctl.plan.params import embedding_params
from llmctl.plan.specs import BYTES, Sharding
from llmctl.run.planning import plan_config, plan_input


def _memory(inp, layout: Layout, rank: int):
    split = split_layers(inp.model.num_layers, layout.pp, layout.vpp, False)
    assert split is not None
    return stage_memory(
        inp.model, inp.cluster, inp.run, layout, split=split, num_microbatches=8, rank=rank
    )


@pytest.mark.parametrize("sharding", [Sharding.none, Sharding.distributed])
def test_frozen_embeddings_drop_their_grads_and_optimizer_state(sharding):
    cfg = compose("llama3_8b_pretrain_8gpu_h100_fp8", ["precision=bf16"])
    inp = plan_input(cfg)
    frozen_inp = plan_input(compose(
        "llama3_8b_pretrain_8gpu_h100_fp8", ["precision=bf16", "train.freeze_embeddings=true"]
    ))  # fmt: skip
    assert frozen_inp.run == replace(inp.run, freeze_embeddings=True)
    layout = Layout(tp=2, pp=2, dp=2, micro_batch_size=1, optimizer_sharding=sharding)
    n = embedding_params(inp.model, layout.tp)
    shard = layout.dp if sharding == Sharding.distributed else 1
    first, first_frozen = _memory(inp, layout, 0), _memory(frozen_inp, layout, 0)
    assert first_frozen.weights_gib == first.weights_gib
    grad_bytes = BYTES[inp.run.grad_dtype]
    assert first.grads_gib - first_frozen.grads_gib == pytest.approx(n * grad_bytes / GIB)
    assert first.optimizer_gib - first_frozen.optimizer_gib == pytest.approx(n * 12 / shard / GIB)
    assert _memory(frozen_inp, layout, 1) == _memory(inp, layout, 1)  # the last stage: no input
    # embedding, the output layer trains


def test_plan_takes_seq_length_from_sft_packs(tmp_path):
    pytest.importorskip("transformers")
    from llmctl.data.sft import SftConfig, build_sft
    from llmctl.data.sft_demo import chat_tokenizer, translate_examples, write_jsonl

    tok = chat_tokenizer(tmp_path / "tok")
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(40))
    prefix = str(tmp_path / "sft")
    build_sft(SftConfig(inputs=[str(src)], output_prefix=prefix, tokenizer=str(tok), seq_length=48))
    base = plan_config(compose("tiny_cpu_sft"))
    packed = plan_config(compose("tiny_cpu_sft", [f"data.prefixes=[{prefix}]"]))
    assert base.input.model.seq_length == 64 and packed.input.model.seq_length == 48
    assert packed.best is not None and base.best is not None
    assert packed.best.memory.activations_gib < base.best.memory.activations_gib
