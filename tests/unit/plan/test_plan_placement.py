"""Placement from the plan: which ranks share a node, an NVLink domain, a pipeline stage,
and whether an allocation's leaf switches hold what the step-time model priced."""

from __future__ import annotations

import pytest

from llmctl.plan import Layout
from llmctl.plan.perf import ring_time
from llmctl.plan.placement import check, placement_of
from tests.unit.plan.memory_rows import cluster


def _place(layout: Layout, nodes: int, gpus: int = 8, nps: int | None = 4) -> object:
    return placement_of(
        layout, nodes=nodes, gpus_per_node=gpus, nvlink_domain_size=gpus, nodes_per_switch=nps
    )


def test_stages_are_blocks_of_consecutive_nodes_in_megatron_rank_order() -> None:
    p = _place(Layout(tp=4, pp=4, dp=8), nodes=16)
    assert p.stage_nodes == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert p.switches == 4 and [p.stage_switches(s) for s in range(4)] == [1, 1, 1, 1]
    assert p.nvlink_groups == ("TP 4 (spans 4 ranks)",)
    assert p.network_groups == ("DP 8 (spans 32 ranks)", "PP 4 (neighbouring stages)")
    small = _place(Layout(tp=2, pp=8), nodes=2)  # four stages per node
    assert small.stage_nodes == ((0,), (0,), (0,), (0,), (1,), (1,), (1,), (1,))
    assert small.network_groups == ("PP 8 (neighbouring stages)",)
    moe = _place(Layout(tp=1, ep=8, dp=16, pp=2), nodes=4)
    assert "EP 8 (spans 8 ranks)" in moe.nvlink_groups
    with pytest.raises(ValueError, match="is 64 ranks, not 2 x 8"):
        _place(Layout(tp=8, pp=8), nodes=2)


def test_nvlink_groups_are_the_ones_the_step_time_prices_at_nvlink_speed() -> None:
    """A group listed inside the NVLink domain is priced by perf.ring_time as one ring over
    NVLink; one listed over the network crosses nodes there too."""
    spec = cluster("dgx_h100")
    for layout, nodes in [(Layout(tp=8, dp=4), 4), (Layout(tp=2, cp=2, dp=8), 4)]:
        p = _place(layout, nodes=nodes)
        for name, size, span in (("TP", layout.tp, layout.tp),
                                 ("CP", layout.cp, layout.tp * layout.cp),
                                 ("DP", layout.dp, layout.tp * layout.cp * layout.dp)):  # fmt: skip
            if size == 1:
                continue
            inside = f"{name} {size} (spans {span} ranks)" in p.nvlink_groups
            one_ring = ring_time(spec, size, span, 1e9) == ring_time(spec, size, 1, 1e9)
            assert inside == one_ring, (layout, name)


def test_check_accepts_compact_allocations_and_names_the_spread() -> None:
    p = _place(Layout(tp=8, pp=2, dp=4), nodes=8, nps=4)
    hosts = [f"gpu{i:02d}" for i in range(8)]
    compact = {h: f"leaf{i // 4}" for i, h in enumerate(hosts)}
    ok = check(p, list(reversed(hosts)), compact)  # torchrun ranks by name, not SLURM order
    assert ok.ok and "under 2 leaf switches (leaf0, leaf1)" in ok.line
    striped = {h: f"leaf{i % 2}" for i, h in enumerate(hosts)}
    bad = check(p, hosts, striped)  # two switches, but every stage straddles them
    assert not bad.ok
    assert bad.line.startswith("pipeline stage 0 (nodes gpu00, gpu01, gpu02, gpu03) spans")
    three = {h: f"leaf{min(i // 3, 2)}" for i, h in enumerate(hosts)}
    spread = check(p, hosts, three)
    assert not spread.ok and "span 3 leaf switches" in spread.line and "assumed 2" in spread.line
    assert "under no leaf switch" in check(p, hosts, {h: "a" for h in hosts[1:]}).line
    assert "7 node(s) allocated, the plan is for 8" in check(p, hosts[:7], compact).line
    with pytest.raises(ValueError, match="nodes_per_switch"):
        check(_place(Layout(tp=8, pp=2, dp=4), nodes=8, nps=None), hosts, compact)


def test_a_stage_larger_than_a_switch_may_span_the_fewest_that_hold_it() -> None:
    p = _place(Layout(tp=8, pp=2, dp=8), nodes=16, nps=4)  # 8-node stages, 4-node leaves
    hosts = [f"n{i:02d}" for i in range(16)]
    assert check(p, hosts, {h: f"s{i // 4}" for i, h in enumerate(hosts)}).ok
    mixed = {h: f"s{(i // 2) % 4}" for i, h in enumerate(hosts)}  # stage 0 on all four
    verdict = check(p, hosts, mixed)
    assert not verdict.ok and "inside 2 switches" in verdict.line


def test_a_leaf_size_below_one_is_one_line_in_plan_and_train() -> None:
    from typer.testing import CliRunner

    from llmctl.cli.main import app

    runner = CliRunner()
    for args in (["plan", "recipe=llama3_70b_pretrain_64gpu_h100_fp8", "--explain"],
                 ["train", "recipe=tiny_cpu", "launcher=slurm", "cluster.num_nodes=2",
                  "--dp", "2", "--dry-run"]):  # fmt: skip
        res = runner.invoke(app, [*args, "cluster.nodes_per_switch=0"])
        assert res.exit_code == 2, res.output
        assert "cluster.nodes_per_switch must be >= 1 (or null), got 0" in res.output
        assert "Traceback" not in res.output
