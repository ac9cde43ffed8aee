"""The planner's memory terms against the bytes real megatron-core models hold on CPU.

`plan_memory_oracle.worker` runs each layout of `LAYOUTS` in 2 gloo ranks through
`llmctl.train.memprobe` (weights, megatron-core DDP grad buffers, the optimizer's own state
tensors, the tensors autograd saves; under FSDP the local shards plus the peak of parameters
and gradients gathered at once). Each term must be within 3 % of the planner's.
"""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from typing import Any

import pytest
from plan_memory_oracle import LAYOUTS

from llmctl.plan import Layout
from llmctl.plan.layout import split_layers
from llmctl.plan.memory import activation_bytes, stage_terms
from llmctl.plan.specs import AttentionKernel, ModelSpec, Recompute, RunSpec, Sharding

TOLERANCE = 0.03


def probe_model() -> ModelSpec:
    """`memprobe.ProbeShape()` as the planner sees it."""
    return ModelSpec(
        name="probe",
        num_layers=4,
        hidden_size=64,
        ffn_hidden_size=160,
        num_attention_heads=8,
        num_query_groups=2,
        kv_channels=8,
        vocab_size=256,
        seq_length=64,
        gated_mlp=True,
        layernorm_bias=True,
        add_bias_linear=False,
    )


def probe_run() -> RunSpec:
    """bf16 with fp32 grads, megatron's local (unfused, CPU) attention and softmax."""
    return RunSpec(
        global_batch_size=8,
        compute_dtype="bf16",
        params_dtype="bf16",
        attention=AttentionKernel.unfused,
        fused_kernels=False,
    )


def predicted(name: str, rank: int) -> dict[str, float]:
    """The planner's bytes for layout `name` on global `rank` (TP inner, PP outer)."""
    kw = LAYOUTS[name]
    tp, pp, vpp = kw.get("tp", 1), kw.get("pp", 1), kw.get("vpp", 1)
    m = kw.get("num_microbatches", 1)
    sharding = Sharding.distributed if kw.get("distributed_optimizer") else Sharding.none
    sharding = Sharding.full if kw.get("fsdp") else sharding
    layout = Layout(
        tp=tp,
        pp=pp,
        vpp=vpp,
        dp=2 // (tp * pp),
        recompute=Recompute(kw.get("recompute", "none")),
        optimizer_sharding=sharding,
    )
    model, run = probe_model(), replace(probe_run(), fsdp_wrapper=bool(kw.get("fsdp")))
    split = split_layers(model.num_layers, pp, vpp, False)
    assert split is not None
    stage = rank // (2 // pp)
    w, g, o, peak, _ = stage_terms(model, run, layout, split=split, num_microbatches=m, rank=stage)
    layers = model.num_layers // pp
    one = activation_bytes(
        model, run, layout, layers=layers, rank=stage, num_microbatches=m, peak=False
    )
    return {
        "weights": w,
        "grads": g,
        "optimizer": o,
        "activations_one": one,
        "activations_peak": peak,
    }


TERMS = ("weights", "grads", "optimizer", "activations_one", "activations_peak")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import plan_memory_oracle as oracle

    out = tmp_path_factory.mktemp("memoracle")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(oracle.worker, args=(2, port, str(out), list(LAYOUTS)), nprocs=2)
    return [json.loads((out / f"mem{r}.json").read_text()) for r in (0, 1)]


def errors(measured: list[dict[str, Any]]) -> dict[tuple[str, int, str], float]:
    """(layout, rank, term) -> predicted / measured - 1."""
    out = {}
    for rank, per in enumerate(measured):
        for name in LAYOUTS:
            pred = predicted(name, rank)
            got = dict(per[name])
            # FSDP: the shards plus the peak of what is gathered on top (0 without FSDP)
            got["weights"] += got.get("gathered_weights", 0)
            got["grads"] += got.get("gathered_grads", 0)
            for term in TERMS:
                out[(name, rank, term)] = pred[term] / got[term] - 1.0
    return out


@pytest.mark.multiproc
@pytest.mark.slow
def test_each_memory_term_within_3_percent_of_megatron_core(
    measured: list[dict[str, Any]],
) -> None:
    errs = errors(measured)
    for (name, rank, term), err in sorted(errs.items()):
        print(f"{name:20s} rank{rank} {term:17s} {100 * err:+6.2f} %")
    bad = {k: round(100 * v, 2) for k, v in errs.items() if abs(v) > TOLERANCE}
    assert not bad, bad
