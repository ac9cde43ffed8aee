"""Step-time terms of pipeline-parallel layouts that megatron-core runs and a planner must not
set to zero: exposed sends/receives without interleaving, the tied-embedding gradient
all-reduce between the first and the last stage, the optimizer step of the rank that holds the
embeddings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmctl.config import compose
from llmctl.plan import Layout, PlanInput, Recompute, Sharding, evaluate
from llmctl.plan.params import total_params
from llmctl.plan.specs import BYTES
from llmctl.run.planning import plan_input


def _gpt22b() -> PlanInput:
    return plan_input(compose("megatron_22b_pretrain_8gpu_a100_bf16", []))


def _with(inp: PlanInput, **eff: float) -> PlanInput:
    cluster = replace(inp.cluster, efficiency=replace(inp.cluster.efficiency, **eff))
    return replace(inp, cluster=cluster)


def test_megatron_core_refuses_p2p_overlap_without_interleaving() -> None:
    """The oracle: megatron-core's 1F1B schedule without VPP raises on `overlap_p2p_comm`."""
    torch = pytest.importorskip("torch")
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.pipeline_parallel.schedules import (
        forward_backward_pipelining_without_interleaving,
    )

    model = torch.nn.Linear(2, 2)
    model.config = ModelParallelConfig(overlap_p2p_comm=True, batch_p2p_comm=False)
    with pytest.raises(ValueError, match="does not support overlapping p2p"):
        forward_backward_pipelining_without_interleaving(
            forward_step_func=None,
            data_iterator=iter([]),
            model=model,
            num_microbatches=4,
            seq_length=16,
            micro_batch_size=1,
        )


def test_pipeline_sends_wait_without_interleaving() -> None:
    """`p2p_overlap` hides sends/receives of interleaved layouts only (untied embeddings:
    sends and receives alone)."""
    inp = _gpt22b()
    inp = replace(inp, model=replace(inp.model, tied_embeddings=False))
    flat = Layout(
        tp=4, pp=2, micro_batch_size=1, sequence_parallel=True, optimizer_sharding=Sharding.none
    )
    interleaved = replace(flat, vpp=2)
    times = {
        (lay.vpp, ov): evaluate(_with(inp, p2p_overlap=ov), lay).time.pp_comm_s
        for lay in (flat, interleaved)
        for ov in (0.0, 0.9)
    }
    assert times[(1, 0.9)] == times[(1, 0.0)] > 0
    assert times[(2, 0.9)] < times[(2, 0.0)] / 2


def test_tied_embedding_gradient_is_all_reduced_between_first_and_last_stage() -> None:
    """GPT ties the output layer to the word embedding: with PP > 1 megatron-core's
    `finalize_model_grads` all-reduces the whole main gradient (fp32 here) of the first and
    the last stage's copies. Each of the two ranks sends at least the whole gradient once."""
    inp = _gpt22b()
    assert inp.model.tied_embeddings and inp.run.grad_dtype == "fp32"
    lay = Layout(
        tp=4, pp=2, micro_batch_size=1, sequence_parallel=True, optimizer_sharding=Sharding.none
    )
    untied = replace(inp, model=replace(inp.model, tied_embeddings=False))
    extra = evaluate(inp, lay).time.pp_comm_s - evaluate(untied, lay).time.pp_comm_s
    grad = inp.model.vocab_size * inp.model.hidden_size / lay.tp * BYTES[inp.run.grad_dtype]
    nvlink = inp.cluster.nvlink_bandwidth_gb_s * 1e9
    assert grad / nvlink < extra < 2 * grad / (nvlink * inp.cluster.efficiency.link)
    one_stage = replace(lay, pp=1, tp=8)
    assert evaluate(inp, one_stage).time.pp_comm_s == 0.0
    frozen = replace(inp, run=replace(inp.run, freeze_embeddings=True))
    assert evaluate(frozen, lay).time.pp_comm_s == pytest.approx(
        evaluate(untied, lay).time.pp_comm_s
    )


def test_optimizer_steps_every_parameter_of_the_rank() -> None:
    """The optimizer step reads and writes every parameter the rank holds: with PP=1 the whole
    model / TP (counts checked against megatron-core in test_plan_params), untied output layer
    included; with PP=2 the stage holding the embeddings, not only its layers."""
    inp = plan_input(compose("llama3_8b_pretrain_8gpu_h100_fp8", []))
    model, run, cluster = inp.model, inp.run, inp.cluster
    per_param = 24.0 + BYTES[run.grad_dtype] + BYTES[run.params_dtype]
    hbm = cluster.hbm_bandwidth_gb_s * 1e9
    lay = Layout(tp=1, dp=8, optimizer_sharding=Sharding.none, recompute=Recompute.selective)
    opt = evaluate(inp, lay).time.optimizer_s
    assert opt * hbm / per_param == pytest.approx(total_params(model), rel=1e-6)
    staged = Layout(
        tp=1, pp=2, dp=4, optimizer_sharding=Sharding.none, recompute=Recompute.selective
    )
    layers_only = total_params(model) - 2 * model.vocab_size * model.hidden_size
    assert evaluate(inp, staged).time.optimizer_s * hbm / per_param > layers_only / 2 * 1.05


def test_2022_megatron_lm_scatters_non_sp_pipeline_sends_over_tp() -> None:
    """2022 Megatron-LM (the A100 file's fitted runs) sent a non-SP boundary activation as
    1/TP per TP rank and all-gathered it over NVLink (`scatter_gather_tensors_in_pipeline`);
    megatron-core (H100 file) sends the whole activation from every TP rank."""
    a100 = plan_input(compose("gpt3_175b_pretrain_64gpu_a100_bf16", []))
    h100 = plan_input(compose("llama3_70b_pretrain_64gpu_h100_fp8", []))
    assert a100.cluster.efficiency.p2p_scatter_gather == 1.0
    assert h100.cluster.efficiency.p2p_scatter_gather == 0.0
    untied = replace(a100, model=replace(a100.model, tied_embeddings=False))
    lay = Layout(
        tp=8, pp=8, micro_batch_size=1, recompute=Recompute.full, optimizer_sharding=Sharding.none
    )
    scattered = evaluate(untied, lay).time.pp_comm_s
    whole = evaluate(_with(untied, p2p_scatter_gather=0.0), lay).time.pp_comm_s
    sp = evaluate(untied, replace(lay, sequence_parallel=True)).time.pp_comm_s
    assert sp < scattered < whole / 3


def test_last_gradient_bucket_and_first_fsdp_gather_are_exposed() -> None:
    """megatron-core DDP reduces gradients in buckets of max(40M, 1M x DP) parameters as the
    backward produces them (`DistributedDataParallel.__init__`): even when the backward is
    long enough to hide the rest, the last bucket's reduce comes after it. Megatron FSDP's
    first layer gather and last layer reduce-scatter likewise have no compute around them."""
    inp = _with(_gpt22b(), overlap_cost=0.0)  # hidden communication costs nothing here
    nvlink = inp.cluster.nvlink_bandwidth_gb_s * 1e9
    grad, weight = BYTES[inp.run.grad_reduce_dtype], BYTES[inp.run.params_dtype]
    ddp = Layout(
        tp=4, dp=2, micro_batch_size=2, sequence_parallel=True, optimizer_sharding=Sharding.none
    )
    ev = evaluate(inp, ddp)
    assert ev.time.dp_comm_s < ev.time.gemm_s / 10  # the reduce fits under the backward
    assert ev.time.dp_comm_s > 4e7 * grad / nvlink  # all-reduce of 40M params: >= 1x bytes
    fsdp = evaluate(inp, replace(ddp, optimizer_sharding=Sharding.full))
    layer = 12 * inp.model.hidden_size**2 / ddp.tp
    assert fsdp.time.dp_comm_s > layer * (grad + weight) / 2 / nvlink
