"""Mixture-of-experts planning: a practitioner's published layout ranks among the fastest.

The shipped Mixtral 8x7B recipe (64 H100, BF16) reproduces no published measured run (none
with its layout is public: docs/planner.md, MoE rows). The outside reference is NeMo's own
Mixtral 8x7B pretrain recipe, which NVIDIA ships for 8 DGX H100 nodes with TP1 PP4 VPP8 EP8
and no recompute (NVIDIA/NeMo nemo/collections/llm/recipes/mixtral_8x7b.py at 8cfedd72, lines
60-67). The planner must let it fit at that recompute setting and rank it in its top 10.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmctl.config import compose
from llmctl.plan import Layout, Recompute, evaluate, plan
from llmctl.run.planning import plan_input

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
    from llmctl.plan.moe import overlap_refusal
    from llmctl.plan.report import result_dict
    from llmctl.run.planning import plan_config

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


def test_expert_tensor_parallel_size_as_megatron_core_builds_it() -> None:
    """Bridge's Qwen3-235B runs TP2 EP32 with ETP1 on 256 H100 (fixture `etp_cite`). megatron-
    core's initialize_model_parallel needs ETP*EP*PP to divide the world (256 / (1*32*8)), so
    with its default ETP = TP (2*32*8 = 512) that layout does not exist; the search finds it
    only with `etp=1`, and there every rank holds its 4 experts at full width (the parameter
    counts: test_plan_params.test_params_match_megatron, EXPERT_LAYOUTS)."""
    import json
    from pathlib import Path

    from llmctl.plan import Constraints
    from llmctl.plan.reference import row_input, row_layout
    from llmctl.run.planning import cluster_spec

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "plan" / "published_runs.json"
    published = json.loads(fixture.read_text())
    row = next(r for r in published["rows"] if r["id"] == "bridge26.04.01-qwen3_235b_a22b")
    assert row["etp"] == 1 and "expert_tensor_parallel_size = 1" in row["etp_cite"]
    cluster = cluster_spec(compose(RECIPE, [f"cluster={row['cluster']}"]))
    inp = row_input(row, published["models"], cluster)
    fixed = Constraints(tp=2, pp=8, vpp=4, ep=32, micro_batch_size=1, recompute=Recompute.none)
    default = plan(replace(inp, constraints=fixed), suggest=False)
    assert not default.num_candidates
    assert any("EP*ETP = 32*2" in r.reason for r in default.rejections), default.rejections
    etp1 = plan(replace(inp, constraints=replace(fixed, etp=1)), suggest=False)
    bridge = row_layout(row)
    assert bridge.etp == 1 and bridge.expert_dp == 1
    assert any(e.layout == bridge for e in etp1.ranked), [e.layout.short() for e in etp1.ranked]
    as_tp = evaluate(inp, replace(bridge, etp=None))  # what the model charged before
    assert evaluate(inp, bridge).memory.weights_gib > as_tp.memory.weights_gib


@pytest.mark.parametrize(
    ("tp", "etp", "ep", "pp", "world"),
    [(2, 1, 32, 8, 256), (2, 2, 8, 1, 64), (1, 1, 8, 2, 16), (4, 1, 8, 1, 32), (4, 2, 4, 2, 64)],
)
def test_expert_parallel_group_span_is_megatron_cores(
    tp: int, etp: int, ep: int, pp: int, world: int
) -> None:
    """The all-to-all's ranks: megatron-core's expert RankGenerator (parallel_state.py, the
    order initialize_model_parallel uses) puts each EP group on `moe.ep_span` consecutive
    ranks, which sets how many nodes its all-to-all crosses."""
    pytest.importorskip("megatron.core")
    from megatron.core.parallel_state import RankGenerator

    from llmctl.plan.moe import ep_span

    gen = RankGenerator(
        tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order="tp-cp-ep-dp-pp"
    )
    groups = gen.get_ranks("ep")
    span = ep_span(tp, ep, 0 if etp == tp else etp)
    nodes = -(-span // 8)  # 8-GPU nodes the span covers, each holding ep / nodes ranks
    assert groups and all(len(g) == ep for g in groups)
    for group in groups:
        per_node = [sum(1 for r in group if r // 8 == n) for n in {r // 8 for r in group}]
        assert per_node == [ep // nodes] * nodes, (group, span)
