"""Search rules: what is enumerated, what is rejected and why, explicit-layout errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmctl.plan import (
    ClusterSpec,
    Constraints,
    Layout,
    ModelSpec,
    PlanInput,
    Recompute,
    RunSpec,
    SearchSpec,
    Sharding,
    evaluate,
    plan,
    split_layers,
)
from llmctl.plan.search import candidates

LLAMA = ModelSpec(
    name="llama_like",
    num_layers=32,
    hidden_size=4096,
    ffn_hidden_size=14336,
    num_attention_heads=32,
    num_query_groups=8,
    kv_channels=128,
    vocab_size=128256,
    seq_length=4096,
    gated_mlp=True,
    layernorm_bias=False,
    add_bias_linear=False,
)
MOE = replace(LLAMA, name="moe", num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=14336)
H100 = ClusterSpec(
    name="h100",
    num_nodes=8,
    gpus_per_node=8,
    hbm_gib=79.6,
    hbm_bandwidth_gb_s=3350,
    peak_tflops={"bf16": 989.4},
    achievable_fraction={"bf16": 0.7},
    nvlink_domain_size=8,
    nvlink_bandwidth_gb_s=450,
    internode_bandwidth_gb_s=50,
    internode_latency_us=5,
    cuda_context_gib=0.6,
    nccl_buffer_gib=1.5,
    fragmentation_fraction=0.05,
)
RUN = RunSpec(global_batch_size=256, compute_dtype="bf16", params_dtype="bf16")


def _inp(**cons: object) -> PlanInput:
    return PlanInput(model=LLAMA, cluster=H100, run=RUN, constraints=Constraints(**cons))  # type: ignore[arg-type]


def test_every_candidate_respects_the_rules() -> None:
    layouts, _ = candidates(_inp())
    assert layouts
    for lay in layouts:
        assert lay.world_size == 64
        assert LLAMA.num_query_groups % lay.tp == 0 and lay.tp <= 8
        assert lay.cp == 1 or LLAMA.seq_length % (2 * lay.cp) == 0
        assert split_layers(32, lay.pp, lay.vpp, False) is not None
        assert RUN.global_batch_size % (lay.micro_batch_size * lay.dp) == 0
        assert lay.sequence_parallel == (lay.tp > 1)
        assert lay.vpp == 1 or lay.pp > 1
        assert not (lay.optimizer_sharding == Sharding.full and lay.pp > 1)
    dims = {(lay.tp, lay.pp, lay.cp) for lay in layouts}
    assert (8, 1, 1) in dims and (1, 8, 1) in dims and (2, 2, 2) in dims
    assert {lay.recompute for lay in layouts} == set(Recompute)
    assert {lay.optimizer_sharding for lay in layouts} == set(Sharding)


def test_rejection_lines_name_the_reason() -> None:
    res = plan(_inp())
    reasons = [r.reason for r in res.rejections]
    assert "TP=16 does not divide 8 query groups" in reasons
    wide = replace(LLAMA, num_query_groups=32)
    res = plan(replace(_inp(), model=wide))
    assert "TP=16 crosses the 8-GPU NVLink domain" in [r.reason for r in res.rejections]
    allowed = replace(_inp(), model=wide, constraints=Constraints(allow_tp_outside_nvlink=True))
    assert any(e.layout.tp == 16 for e in plan(allowed).ranked) or any(
        lay.tp == 16 for lay in candidates(allowed)[0]
    )


def test_ranked_layouts_fit_and_are_sorted() -> None:
    res = plan(_inp())
    assert res.best is not None
    steps = [e.rates.step_s for e in res.ranked]
    assert steps == sorted(steps)
    assert all(e.fits and e.memory.total_gib <= res.usable_gib for e in res.ranked)
    assert len(res.points) == res.num_candidates


@pytest.mark.parametrize(
    ("cons", "message"),
    [
        (dict(tp=8, pp=3), "64 GPUs not divisible by TP*PP*CP = 8*3*1"),
        (dict(tp=16), "TP=16 does not divide 8 query groups"),
        (dict(cp=3), "64 GPUs not divisible by TP*PP*CP = 1*1*3"),
        (dict(pp=64), "PP=64 does not divide 32 layers"),
        (dict(vpp=2, pp=1), "VPP=2 needs PP > 1"),
        (dict(ep=2), "EP=2 needs an MoE model"),
        (dict(tp=8, pp=1, cp=1, dp=4), "DP=4 but 64 GPUs / (TP*PP*CP = 8*1*1) = 8"),
        (dict(micro_batch_size=3), "GBS 256 not divisible by MBS 3"),
    ],
)
def test_impossible_explicit_layout_names_the_product(cons: dict[str, int], message: str) -> None:
    with pytest.raises(
        ValueError, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")
    ):
        plan(_inp(**cons))


def test_fixed_dimensions_restrict_the_search() -> None:
    res = plan(_inp(tp=4, pp=2, recompute=Recompute.selective))
    layouts, _ = candidates(_inp(tp=4, pp=2, recompute=Recompute.selective))
    assert {(lay.tp, lay.pp, lay.recompute) for lay in layouts} == {(4, 2, Recompute.selective)}
    assert all(e.layout.tp == 4 and e.layout.pp == 2 for e in res.ranked)


def test_uneven_pipeline_split_rules() -> None:
    assert split_layers(126, 8, 8, False) is not None  # Llama-3.1 405B: embedding+loss
    s = split_layers(126, 8, 1, False)
    assert s is not None and (s.first, s.middle, s.last) == (15, 16, 15)
    assert split_layers(31, 4, 1, False) is None
    u = split_layers(31, 4, 1, True)
    assert u is not None and (u.first, u.middle, u.last) == (7, 8, 8)


def test_moe_enumerates_expert_parallel() -> None:
    inp = replace(_inp(), model=MOE)
    layouts, _ = candidates(inp)
    eps = {lay.ep for lay in layouts}
    assert eps == {1, 2, 4, 8}
    assert all((lay.dp * lay.cp) % lay.ep == 0 for lay in layouts)
    ev8 = evaluate(inp, Layout(dp=64, ep=8, micro_batch_size=1))
    ev1 = evaluate(inp, Layout(dp=64, ep=1, micro_batch_size=1))
    assert ev8.memory.weights_gib < ev1.memory.weights_gib
    assert ev8.time.moe_comm_s > 0 == ev1.time.moe_comm_s


def test_memory_terms_respond_to_options() -> None:
    inp = _inp()
    base = Layout(tp=2, dp=32, micro_batch_size=1, sequence_parallel=True)
    none = evaluate(inp, replace(base, optimizer_sharding=Sharding.none)).memory
    dist = evaluate(inp, base).memory
    full = evaluate(inp, replace(base, optimizer_sharding=Sharding.full)).memory
    assert full.weights_gib < dist.weights_gib == none.weights_gib
    assert dist.optimizer_gib == pytest.approx(none.optimizer_gib / 32)
    sel = evaluate(inp, replace(base, recompute=Recompute.full)).memory
    assert sel.activations_gib < dist.activations_gib
    pipe = evaluate(inp, Layout(tp=2, pp=4, dp=8, sequence_parallel=True))
    assert pipe.memory.stage in ("first", "last", "middle")


def test_step_time_terms() -> None:
    inp = _inp()
    a = evaluate(inp, Layout(tp=1, pp=1, dp=64, micro_batch_size=1))
    b = evaluate(inp, Layout(tp=1, pp=4, dp=16, micro_batch_size=1))
    c = evaluate(inp, Layout(tp=1, pp=4, vpp=2, dp=16, micro_batch_size=1))
    assert a.time.bubble_s == 0 < c.time.bubble_s < b.time.bubble_s
    m = b.layout.num_microbatches(RUN.global_batch_size)
    slot = (b.time.compute_s + b.time.tp_comm_s) / m
    # 1F1B: the fill and drain run on the 3 stages other than the bottleneck (the last: its
    # 8 layers and the output layer), so 3 lighter slots; equal (loss-balanced) stages: 3.
    assert 2 * slot < b.time.bubble_s < 3 * slot
    bal = evaluate(inp, replace(b.layout, loss_balanced=True))
    assert bal.time.bubble_s == pytest.approx(3 * (bal.time.compute_s + bal.time.tp_comm_s) / m)
    full = evaluate(inp, Layout(dp=64, micro_batch_size=1, recompute=Recompute.full))
    assert full.time.compute_s > a.time.compute_s
    assert full.rates.tflops_per_gpu < a.rates.tflops_per_gpu
    assert 0 < a.rates.mfu < 1


def test_nothing_fits_says_what_would() -> None:
    small = replace(H100, num_nodes=1, hbm_gib=40.0)
    inp = PlanInput(
        model=LLAMA,
        cluster=small,
        run=RUN,
        constraints=Constraints(tp=1, pp=1, cp=1, recompute=Recompute.none),
        search=SearchSpec(micro_batch_sizes=(4,)),
    )
    res = plan(inp)
    assert res.best is None and res.closest is not None
    assert res.suggestions
    text = " ".join(res.suggestions)
    assert "recompute" in text or "nodes" in text or "PP" in text


def test_fixed_pp_rejects_no_layout_its_own_product_rules_out() -> None:
    """With PP fixed the search lists only TP/CP that fit the rest of the world: `--pp 4` on
    64 GPUs used to report '64 GPUs not divisible by TP*PP*CP = 1*4*32' and the like, layouts
    nobody asked for."""
    from typer.testing import CliRunner

    from llmctl.cli.main import app

    res = CliRunner().invoke(
        app, ["plan", "recipe=mixtral_8x7b_pretrain_64gpu_h100_bf16", "--pp", "4"]
    )
    assert res.exit_code == 0, res.output
    assert "not divisible by TP*PP*CP" not in res.output and "TP*CP" not in res.output
    assert "Fastest layouts that fit" in res.output


def test_fsdp_with_pp_is_planned_when_fixed_and_searched_for_torch_native() -> None:
    """torchtitan runs FSDP2 with PP (Llama 3.1 405B: FSDP8 TP8 PP8); Megatron FSDP with PP
    is accepted when fixed (issue 21)."""
    from dataclasses import replace

    fixed = _inp(optimizer_sharding=Sharding.full, pp=4)
    layouts, _ = candidates(fixed)
    assert layouts and all(
        lay.pp == 4 and lay.optimizer_sharding == Sharding.full for lay in layouts
    )
    native = replace(_inp(), run=replace(RUN, torch_native=True))
    layouts, _ = candidates(native)
    assert any(lay.optimizer_sharding == Sharding.full and lay.pp > 1 for lay in layouts)
