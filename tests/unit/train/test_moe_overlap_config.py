"""`parallel.moe_a2a_overlap` reaches megatron-core, and llmctl refuses exactly what it refuses.

Oracle: megatron-core's own TransformerConfig validation of `overlap_moe_expert_parallel_comm`
(EP > 1, no full recompute, VPP when PP > 1, all-to-all dispatcher, 16-bit model). Config
construction only; the overlapped schedule itself needs CUDA streams, so a CPU run is refused
before launch in one line.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.layout import check_moe_overlap, resolve_layout
from llmctl.run.precision import recipe_for

pytest.importorskip("megatron.core")

MOE = ["model.num_experts=4", "model.moe_router_topk=2", "model.num_layers=4"]
GPU = ["cluster=dgx_h100", "cluster.num_nodes=1", "cluster.gpus_per_node=8", "precision=bf16"]
GPU += ["parallel.micro_batch_size=1", "train.global_batch_size=16"]


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize(("ep", "pp", "vpp"), [(2, 1, 1), (1, 1, 1), (2, 2, 1), (2, 2, 2)])
def test_overlap_refusals_match_megatron_core(ep: int, pp: int, vpp: int, recompute: str) -> None:
    from llmctl.train.model import transformer_config

    over = [f"parallel.ep={ep}", f"parallel.pp={pp}", f"parallel.vpp={vpp}"]
    cfg = compose("tiny_cpu", [*MOE, *GPU, *over, f"parallel.recompute={recompute}"])
    layout = replace(resolve_layout(cfg, 8), moe_a2a_overlap=True)
    try:
        check_moe_overlap(layout)
        refused = None
    except UserError as exc:
        refused = str(exc)
    try:
        c = transformer_config(
            cfg.model, layout, cfg.precision, recipe_for(cfg.precision), on_gpu=True
        )
    except AssertionError as exc:
        assert refused is not None and "\n" not in refused, f"megatron-core refuses: {exc}"
        return
    assert refused is None, f"megatron-core accepts a layout llmctl refuses: {refused}"
    assert c.overlap_moe_expert_parallel_comm and c.moe_token_dispatcher_type == "alltoall"


def test_overlap_off_leaves_megatron_defaults() -> None:
    from llmctl.train.model import transformer_config

    cfg = compose("tiny_cpu", [*MOE, *GPU, "parallel.ep=2"])
    layout = resolve_layout(cfg, 8)
    assert not layout.moe_a2a_overlap
    c = transformer_config(cfg.model, layout, cfg.precision, recipe_for(cfg.precision), on_gpu=True)
    assert not c.overlap_moe_expert_parallel_comm


def test_overlap_on_cpu_is_one_line_before_launch() -> None:
    from llmctl.run.preflight import preflight

    over = ["precision=bf16", "parallel.ep=2", "parallel.moe_a2a_overlap=true"]
    cfg = compose("tiny_cpu", [*MOE, *over])
    with pytest.raises(UserError, match=r"^parallel.moe_a2a_overlap=true needs CUDA[^\n]*$"):
        preflight(cfg, 2)
    with pytest.raises(UserError, match=r"^parallel.moe_a2a_overlap needs EP > 1 [^\n]*$"):
        preflight(compose("tiny_cpu", [*MOE, *over, "parallel.ep=1"]), 2)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [([], "MoE model"), ([*MOE, "precision=fp32"], "precision bf16, fp16 or fp8")],
)
def test_overlap_config_errors_name_the_field(overrides: list[str], field: str) -> None:
    with pytest.raises(UserError, match=f"^parallel.moe_a2a_overlap=true needs .*{field}"):
        compose("tiny_cpu", [*overrides, "parallel.moe_a2a_overlap=true"])
    with pytest.raises(UserError, match=r"^parallel\.etp needs an MoE model"):
        compose("tiny_cpu", ["parallel.etp=1"])


@pytest.mark.parametrize(("etp", "expected"), [(None, 2), (1, 1)])
def test_expert_tensor_parallel_size_reaches_megatron_core(etp: int | None, expected: int) -> None:
    """`parallel.etp` is megatron-core's expert_tensor_parallel_size; unset, megatron-core's
    default (TP) applies."""
    from llmctl.train.model import transformer_config

    over = ["parallel.tp=2", "parallel.ep=2", "parallel.sequence_parallel=true"]
    over += [] if etp is None else [f"parallel.etp={etp}"]
    cfg = compose("tiny_cpu", [*MOE, *GPU, *over])
    layout = resolve_layout(cfg, 8)
    assert layout.etp == etp
    c = transformer_config(cfg.model, layout, cfg.precision, recipe_for(cfg.precision), on_gpu=True)
    assert c.expert_tensor_parallel_size == expected and c.tensor_model_parallel_size == 2


def test_moe_tensor_parallel_without_sequence_parallel_is_one_line() -> None:
    """megatron-core's MoELayer raises on the first training forward with TP > 1 and no
    sequence parallelism (moe_layer.py); llmctl's CPU layer runs no SP, so it is refused
    before launch, and the search drops such layouts."""
    from llmctl.plan import Layout
    from llmctl.plan.moe import layout_refusal
    from llmctl.run.preflight import preflight

    cfg = compose("tiny_cpu", [*MOE, "parallel.tp=2"])
    with pytest.raises(UserError, match=r"^parallel\.tp=2 with a MoE model needs sequence [^\n]*$"):
        preflight(cfg, 2)
    assert layout_refusal(Layout(tp=2, ep=2, dp=2), False)
    assert layout_refusal(Layout(tp=2, ep=2, dp=2, sequence_parallel=True), False) is None
