"""`precision.attention_backend` reaches megatron-core: the TransformerConfig carries it and
the built model runs megatron's own (local, unfused) core attention on CPU; kernels that need
Transformer Engine are refused in one line before launch."""

from __future__ import annotations

import os

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.precision import RECIPES, megatron_attention_backend

pytest.importorskip("megatron.core")


def test_te_backends_pass_through_and_cpu_runs_local() -> None:
    cfg = compose("tiny_cpu", [])
    for asked in ("auto", "flash", "fused", "unfused"):
        cfg.precision.attention_backend = asked
        assert megatron_attention_backend(cfg.precision, use_te=True) == asked
        assert megatron_attention_backend(cfg.precision, use_te=False) == "local"


def test_cpu_model_carries_the_backend_and_keeps_the_environment(one_thread: None) -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnBackend

    from llmctl.run.layout import resolve_layout
    from llmctl.train import cpu_compat, parallel
    from llmctl.train.model import build_model_chunks, transformer_config

    cfg = compose("tiny_cpu", ["precision.attention_backend=unfused"])
    before = {k: os.environ.get(k) for k in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN")}
    parallel.init_distributed()
    try:
        layout = resolve_layout(cfg, 1)
        parallel.init_model_parallel(layout, 1, on_gpu=False)
        config = transformer_config(cfg.model, layout, cfg.precision, RECIPES["fp32"], on_gpu=False)
        assert config.attention_backend == AttnBackend.local
        (chunk,) = build_model_chunks(cfg.model, config, layout, use_te=False, seed=1)
    finally:
        parallel.teardown(destroy_process_group=True)
        cpu_compat.uninstall()
    cores = [m for m in chunk.modules() if type(m).__name__.endswith("DotProductAttention")]
    assert len(cores) == cfg.model.num_layers
    assert all(type(m) is DotProductAttention for m in cores)
    assert {k: os.environ.get(k) for k in before} == before


@pytest.mark.parametrize("asked", ["flash", "fused"])
def test_te_kernel_on_cpu_is_refused_before_launch(asked: str) -> None:
    from llmctl.run.preflight import preflight

    cfg = compose("tiny_cpu", [f"precision.attention_backend={asked}"])
    with pytest.raises(UserError) as err:
        preflight(cfg, 1)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"precision.attention_backend={asked} needs a CUDA GPU with Transformer")
