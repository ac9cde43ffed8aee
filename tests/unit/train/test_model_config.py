"""megatron TransformerConfig for every precision recipe and GPU option builds (config only).

The GPU paths cannot train here, but megatron validates its config at construction, so a wrong
keyword or an invalid combination for bf16/FP8, sequence parallel, recompute or PP shows up on
CPU too. (Only the TE-only fusions are left out: megatron checks that TE is importable.)
"""

from __future__ import annotations

import pytest

from llmctl.config import compose
from llmctl.run.layout import resolve_layout
from llmctl.run.precision import recipe_for

pytest.importorskip("megatron.core")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8_delayed", "fp8_current"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpu_configs_build(precision, recompute):
    import torch

    from llmctl.train.model import transformer_config

    cfg = compose(
        "tiny_cpu",
        [
            f"precision={precision}",
            f"parallel.recompute={recompute}",
            "parallel.tp=2",
            "parallel.pp=2",
            "parallel.sequence_parallel=true",
            "cluster=dgx_h100",  # sequence parallel is refused on CPU clusters
            "cluster.num_nodes=1",
            "cluster.gpus_per_node=4",
        ],
    )
    layout = resolve_layout(cfg, 4)
    c = transformer_config(
        cfg.model, layout, cfg.precision, recipe_for(cfg.precision), on_gpu=True, use_te=False
    )
    half = precision != "fp32"
    assert c.bf16 is half and c.sequence_parallel and c.batch_p2p_comm
    assert c.params_dtype == c.pipeline_dtype == (torch.bfloat16 if half else torch.float32)
    assert c.fp8 == ("hybrid" if precision.startswith("fp8") else None)
    assert c.recompute_granularity == (None if recompute == "none" else recompute)


def test_cpu_config_turns_every_fusion_off():
    from llmctl.train.model import transformer_config

    cfg = compose("tiny_cpu", [])
    c = transformer_config(
        cfg.model, resolve_layout(cfg, 1), cfg.precision, recipe_for(cfg.precision), on_gpu=False
    )
    assert c.use_cpu_initialization and not c.batch_p2p_comm
    for flag in (
        "gradient_accumulation_fusion",
        "bias_activation_fusion",
        "masked_softmax_fusion",
        "bias_dropout_fusion",
        "apply_rope_fusion",
        "persist_layer_norm",
    ):
        assert getattr(c, flag) is False, flag
    assert c.hidden_dropout == c.attention_dropout == 0.0
    assert c.normalization == "RMSNorm" and c.gated_linear_unit and c.num_query_groups == 2
