"""Mixture-of-experts planning: a practitioner's published layout ranks among the fastest.

The shipped Mixtral 8x7B recipe (64 H100, BF16) reproduces no published measured run (none
with its layout is public: docs/planner.md, MoE rows). The outside reference is NeMo's own
Mixtral 8x7B pretrain recipe, which NVIDIA ships for 8 DGX H100 nodes with TP1 PP4 VPP8 EP8
and no recompute (NVIDIA/NeMo nemo/collections/llm/recipes/mixtral_8x7b.py at 8cfedd72, lines
60-67). The planner must let it fit at that recompute setting and rank it in its top 10.
"""

from __future__ import annotations

from dataclasses import replace

from llmctl.config import compose
from llmctl.config.planning import plan_input
from llmctl.plan import Layout, Recompute, evaluate, plan

RECIPE = "mixtral_8x7b_pretrain_64gpu_h100_bf16"
NEMO_LAYOUT = Layout(tp=1, pp=4, vpp=8, ep=8, dp=16, micro_batch_size=1)


def test_nemo_mixtral_layout_fits_and_ranks_in_the_top_10() -> None:
    inp = plan_input(compose(RECIPE, []))
    assert inp.model.is_moe and inp.model.num_experts == 8 and inp.cluster.world_size == 64
    ev = evaluate(inp, NEMO_LAYOUT)
    assert ev.fits and ev.layout.recompute == Recompute.none, ev.memory
    res = plan(replace(inp, search=replace(inp.search, top_k=50)), suggest=False)
    rank = next(i for i, e in enumerate(res.ranked, 1) if e.layout == ev.layout)
    assert rank <= 10, [e.layout.short() for e in res.ranked[:rank]]
    assert all(e.layout.ep > 1 for e in res.ranked[:10])  # expert parallelism pays


def test_recipe_moe_a2a_overlap_override_hides_the_all_to_alls() -> None:
    """`parallel.moe_a2a_overlap` from a recipe reaches the step time, `--json` and the search:
    on, the all-to-alls of the NeMo layout are hidden under compute (less exposed MoE comm,
    at most the compute that hides it), and the search keeps only layouts megatron-core runs
    the overlap on (its TransformerConfig rules: tests/unit/train/test_moe_overlap_config.py)."""
    from llmctl.config.planning import plan_config
    from llmctl.plan.moe import overlap_refusal
    from llmctl.plan.report import result_dict

    fixed = ["parallel.tp=1", "parallel.pp=4", "parallel.vpp=8", "parallel.ep=8"]
    fixed += ["parallel.micro_batch_size=1", "parallel.recompute=none"]
    off = plan_config(compose(RECIPE, fixed))
    on = plan_config(compose(RECIPE, [*fixed, "parallel.moe_a2a_overlap=true"]))
    assert off.best and on.best and off.best.layout == on.best.layout
    t_off, t_on = off.best.time, on.best.time
    assert result_dict(off)["moe_a2a_overlap"] is False and result_dict(on)["moe_a2a_overlap"]
    assert 0.0 < t_on.moe_comm_s < 0.5 * t_off.moe_comm_s
    assert t_on.moe_comm_s >= t_off.moe_comm_s - t_on.compute_s
    assert t_on.total_s < t_off.total_s
    searched = plan_config(compose(RECIPE, ["parallel.moe_a2a_overlap=true"]))
    assert searched.ranked and all(overlap_refusal(e.layout) is None for e in searched.ranked)
    assert {r.reason for r in searched.rejections} >= {
        "moe_a2a_overlap needs EP > 1",
        "moe_a2a_overlap needs recompute other than full",
    }
