"""Parameter counts per rank against real megatron-core GPTModels (the oracle), TP/PP in {1,2}."""

from __future__ import annotations

import json
import socket

import pytest
from plan_megatron_oracle import EXPERT_LAYOUTS, LAYOUTS, SEQ, SHAPES

from llmctl.plan.params import stage_params, total_params
from llmctl.plan.specs import ModelSpec


def _spec(shape: dict[str, object]) -> ModelSpec:
    s = shape
    h, a = int(s["hidden_size"]), int(s["num_attention_heads"])  # type: ignore[call-overload]
    return ModelSpec(
        name="oracle",
        num_layers=int(s["num_layers"]),
        hidden_size=h,  # type: ignore[call-overload]
        ffn_hidden_size=int(s["ffn_hidden_size"]),
        num_attention_heads=a,  # type: ignore[call-overload]
        num_query_groups=int(s["num_query_groups"]),
        kv_channels=h // a,  # type: ignore[call-overload]
        vocab_size=int(s["vocab_size"]),
        seq_length=SEQ,
        gated_mlp=bool(s["swiglu"]),  # type: ignore[call-overload]
        layernorm_bias=not s["rmsnorm"],
        add_bias_linear=bool(s["bias"]),
        learned_positions=0 if s["rope"] else SEQ,
        tied_embeddings=bool(s["tied"]),
        num_experts=int(s["experts"]),
        moe_router_topk=2,  # type: ignore[call-overload]
        moe_ffn_hidden_size=int(s["ffn_hidden_size"]) if s["experts"] else 0,  # type: ignore[call-overload]
    )


def predicted(name: str, tp: int, pp: int, rank: int) -> int:
    """Parameters the planner puts on global `rank` (megatron order: TP inner, PP outer)."""
    spec = _spec(SHAPES[name])
    stage = rank // tp if pp > 1 else 0
    p = stage_params(
        spec,
        tp=tp,
        pp=pp,
        ep=1,
        layers=spec.num_layers // pp,
        first=stage == 0,
        last=stage == pp - 1,
    )
    return p.total


def test_whole_model_count_is_the_sum_of_stages() -> None:
    spec = _spec(SHAPES["llama_gqa"])
    assert predicted("llama_gqa", 1, 2, 0) + predicted("llama_gqa", 1, 2, 1) == total_params(spec)


@pytest.mark.multiproc
@pytest.mark.slow
def test_params_match_megatron(tmp_path: pytest.TempPathFactory) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import plan_megatron_oracle as oracle

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(oracle.worker, args=(2, port, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        measured = json.loads((tmp_path / f"rank{rank}.json").read_text())  # type: ignore[operator]
        for name in SHAPES:
            for tp, pp in LAYOUTS:
                key = f"{name}/{tp}/{pp}"
                assert predicted(name, tp, pp, rank) == measured[key], (key, rank)
        moe = _spec(SHAPES["moe_top2"])
        for tp, ep, etp in EXPERT_LAYOUTS:  # experts split over ETP (Bridge's Qwen3: ETP 1)
            key = f"moe_top2/tp{tp}/ep{ep}/etp{etp}"
            kw = dict(tp=tp, pp=1, ep=ep, layers=moe.num_layers, first=True, last=True)
            assert stage_params(moe, **kw, etp=etp).total == measured[key], (key, rank)  # type: ignore[arg-type]
            if etp != tp:
                assert stage_params(moe, **kw).total != measured[key], key  # type: ignore[arg-type]


def test_grad_memory_matches_megatron_ddp_buffers(tmp_path: pytest.TempPathFactory) -> None:
    """The planner's gradient term equals the grad buffer megatron-core's DDP allocates: fp32
    with grad_reduce_in_fp32, else the bf16 parameter dtype (within bucket padding)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import plan_megatron_oracle as oracle

    from llmctl.plan.specs import BYTES

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(oracle.ddp_worker, args=(1, port, str(tmp_path)), nprocs=1)
    measured = json.loads((tmp_path / "ddp.json").read_text())  # type: ignore[operator]
    for fp32, dtype in (("True", "fp32"), ("False", "bf16")):
        m = measured[fp32]
        assert m["params"] == predicted("llama_gqa", 1, 1, 0)
        assert m["grad_bytes"] == pytest.approx(m["params"] * BYTES[dtype], rel=0.02)
