"""What may change between a checkpoint and the run that loads it (no training here)."""

from __future__ import annotations

import re

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.layout import layout_record, resolve_layout
from llmctl.train.checkpoint import (
    check_compatible,
    check_optimizer_checkpointable,
    preempt_exit_code,
    uses_torch_adam,
)


def _saved(cfg, layout) -> dict:
    """The parts of train_state.json that `check_compatible` reads, as a save writes them."""
    from llmctl.config.values import enum_value as _v
    from llmctl.run.ckpt_compat import ARCH_FIELDS as _ARCH_FIELDS

    return {
        "model": {k: _v(getattr(cfg.model, k)) for k in _ARCH_FIELDS},
        "layout": layout_record(layout, cfg.train.global_batch_size),
    }


def test_layout_changes_are_reported_not_refused() -> None:
    cfg = compose("tiny_cpu", [])
    saved = _saved(cfg, resolve_layout(cfg, 1))
    new = compose("tiny_cpu", ["parallel.tp=2"])
    assert check_compatible(saved, new, resolve_layout(new, 2)) == ["tp"]
    assert check_compatible(saved, cfg, resolve_layout(cfg, 1)) == []


def test_model_change_names_the_field() -> None:
    cfg = compose("tiny_cpu", [])
    saved = _saved(cfg, resolve_layout(cfg, 1))
    other = compose("tiny_cpu", ["model.hidden_size=128"])
    with pytest.raises(UserError, match=r"model\.hidden_size=64, this run has 128"):
        check_compatible(saved, other, resolve_layout(other, 1))


def test_optimizer_sharding_change_is_refused() -> None:
    cfg = compose("tiny_cpu", [])
    saved = _saved(cfg, resolve_layout(cfg, 1))
    saved["layout"]["optimizer_sharding"] = "distributed"
    with pytest.raises(UserError, match="optimizer_sharding changed"):
        check_compatible(saved, cfg, resolve_layout(cfg, 1))


@pytest.mark.skipif(not uses_torch_adam(), reason="TE or Apex present: megatron's fused Adam")
def test_distributed_optimizer_refused_on_torch_adam_path() -> None:
    cfg = compose("tiny_cpu", ["parallel.optimizer_sharding=distributed"])
    layout = resolve_layout(cfg, 2)
    with pytest.raises(UserError, match=r"optimizer_sharding=none or checkpoint\.interval=0"):
        check_optimizer_checkpointable(layout)


def test_preempt_exit_codes() -> None:
    assert preempt_exit_code(15) == 143
    assert preempt_exit_code(10) == 138


@pytest.mark.parametrize(
    ("activation", "now", "changed", "refused"),
    [
        # measured to resume correctly (docs/train.md), SwiGLU's fused fc1 included
        ("swiglu", ["parallel.dp=1"], ["dp"], None),
        ("swiglu", ["parallel.dp=4", "parallel.micro_batch_size=2"], ["dp"], None),
        ("swiglu", ["parallel.dp=1", "parallel.tp=2"], ["tp", "dp"], None),
        ("gelu", ["parallel.dp=1", "parallel.pp=2"], ["pp", "dp"], None),
        # not measured: refused before loading, naming the dimension
        ("swiglu", ["parallel.dp=1", "parallel.cp=2"], None, "does not reshard (cp 1->2)"),
    ],
)
def test_fsdp_checkpoint_reshards_only_as_measured(activation, now, changed, refused) -> None:
    fsdp = ["parallel.optimizer_sharding=full", f"model.activation={activation}"]
    cfg = compose("tiny_cpu", [*fsdp, "parallel.dp=2"])
    saved = _saved(cfg, resolve_layout(cfg, 2))
    new = compose("tiny_cpu", [*fsdp, *now])
    layout = resolve_layout(new)
    if refused is None:
        assert check_compatible(saved, new, layout) == changed
    else:
        with pytest.raises(UserError, match=re.escape(refused)):
            check_compatible(saved, new, layout)


@pytest.mark.parametrize(("tp", "dp"), [(1, 2), (1, 3), (2, 2), (2, 4), (4, 6), (1, 8)])
def test_swiglu_fsdp_pieces_rebuild_the_gate_up_matrix(tp: int, dp: int) -> None:
    """Every (TP rank, DP rank) shard of SwiGLU's fused fc1, placed by `swiglu_fsdp_pieces`,
    lands on the rows of the whole [gate; up] matrix it holds, each row exactly once."""
    from llmctl.train.ckpt_save import swiglu_fsdp_pieces

    f = 12  # gate (and up) rows per TP rank
    gate = [("g", r) for r in range(tp * f)]
    up = [("u", r) for r in range(tp * f)]
    whole: list[object] = [None] * (2 * tp * f)
    for i in range(tp):
        fused = gate[i * f : (i + 1) * f] + up[i * f : (i + 1) * f]  # this TP rank's fc1
        rows = 2 * f // dp
        for j in range(dp):
            shard = fused[j * rows : (j + 1) * rows]  # FSDP's slice of it
            for start, size, index, count in swiglu_fsdp_pieces(rows, j, dp, i, tp):
                assert count * size == 2 * tp * f
                assert all(x is None for x in whole[index * size : (index + 1) * size])
                whole[index * size : (index + 1) * size] = shard[start : start + size]
    assert whole == gate + up
