"""Plain-dict views of planner results (for `--json` and run records). Pure."""

from __future__ import annotations

from typing import Any

from llmctl.plan.flops import step_flops
from llmctl.plan.placement import placement_for
from llmctl.plan.search import Evaluation, PlanResult


def evaluation_dict(ev: Evaluation) -> dict[str, Any]:
    """One layout: degrees, stage split, memory and time terms, rates."""
    r = ev.rates
    return {
        "layout": ev.layout.as_dict(),
        "name": ev.layout.short(),
        "stage_split": {
            "first": ev.split.first,
            "middle": ev.split.middle,
            "last": ev.split.last,
            "method": ev.split.method,
        },
        "fits": ev.fits,
        "memory_gib": {
            "stage": ev.memory.stage,
            "total": ev.memory.total_gib,
            **ev.memory.terms(),
        },
        "time_s": {"total": ev.time.total_s, **ev.time.terms()},
        "step_s": r.step_s,
        "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
        "tflops_per_gpu": r.tflops_per_gpu,
        "mfu": r.mfu,
        "time_to_train_s": r.time_to_train_s,
    }


def result_dict(res: PlanResult) -> dict[str, Any]:
    """The whole plan: inputs in brief, ranking, rejections, suggestions."""
    inp = res.input
    return {
        "model": inp.model.name,
        "cluster": inp.cluster.name,
        "world_size": inp.cluster.world_size,
        "global_batch_size": inp.run.global_batch_size,
        "compute_dtype": inp.run.compute_dtype,
        "moe_a2a_overlap": inp.run.moe_a2a_overlap if inp.model.is_moe else None,
        "model_flops_per_step": step_flops(inp.model, inp.run.global_batch_size),
        "usable_gib": res.usable_gib,
        "num_candidates": res.num_candidates,
        "num_fitting": sum(1 for p in res.points if p[2]),
        "ranked": [evaluation_dict(e) for e in res.ranked],
        "closest": evaluation_dict(res.closest) if res.closest else None,
        "rejections": [{"reason": r.reason, "count": r.count} for r in res.rejections],
        "suggestions": list(res.suggestions),
        "published": evaluation_dict(res.reference) if res.reference else None,
        "published_rank": res.reference_rank,
        "margin_over_published": margin(res),
        "placement": placement_dict(res),
    }


def placement_dict(res: PlanResult) -> dict[str, Any] | None:
    """Where the top pick's ranks must sit (`plan.placement`), None without a pick."""
    chosen = res.best or res.closest
    place = placement_for(res.input.cluster, chosen.layout) if chosen else None
    if place is None:
        return None
    return {
        "nodes": place.nodes,
        "nvlink_groups": list(place.nvlink_groups),
        "network_groups": list(place.network_groups),
        "stage_nodes": [list(n) for n in place.stage_nodes],
        "nodes_per_switch": place.nodes_per_switch,
        "switches": place.switches,
    }


def margin(res: PlanResult) -> dict[str, Any] | None:
    """How much faster the top pick is predicted to be than the published layout, and the
    cost terms that differ most (positive: the published layout spends more there)."""
    ref, best = res.reference, res.best
    if ref is None or best is None:
        return None
    diff = {k: ref.time.terms()[k] - v for k, v in best.time.terms().items()}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:3]
    return {
        "fraction": 1.0 - best.rates.step_s / ref.rates.step_s,
        "seconds": ref.rates.step_s - best.rates.step_s,
        "terms_s": {k: v for k, v in top},
    }
