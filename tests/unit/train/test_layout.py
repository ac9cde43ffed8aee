from __future__ import annotations

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.plan import Layout
from llmctl.run.layout import resolve_layout


def _cfg(*overrides: str):
    return compose("tiny_cpu", list(overrides))


def test_dp_fills_the_world_and_microbatches_follow():
    layout = resolve_layout(_cfg("parallel.tp=2", "parallel.micro_batch_size=1"), world_size=4)
    assert (layout.tp, layout.pp, layout.dp) == (2, 1, 2)
    assert layout.num_microbatches(8) == 8 // (1 * 2)
    assert layout.world_size == 4


def test_explicit_config_beats_plan_and_plan_beats_default():
    cfg = _cfg("parallel.tp=1")
    cfg.parallel.pp = None
    layout = resolve_layout(cfg, world_size=2, planned=Layout(tp=2, pp=2, micro_batch_size=2))
    assert (layout.tp, layout.pp, layout.dp, layout.micro_batch_size) == (1, 2, 1, 4)


def test_world_size_mismatch_names_the_product():
    with pytest.raises(UserError, match=r"world size 3 != TP\*PP\*CP\*DP = 2\*1\*1\*1"):
        resolve_layout(_cfg("parallel.tp=2", "parallel.dp=1"), world_size=3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["parallel.tp=3"], "model.num_attention_heads=4 not divisible by TP=3"),
        (["parallel.pp=2", "parallel.vpp=2"], "model.num_layers=2 not divisible by PP\\*VPP=4"),
        (["parallel.vpp=2"], "parallel.vpp needs parallel.pp > 1"),
        (["parallel.micro_batch_size=3"], "global_batch_size=8 not divisible"),
        (["parallel.sequence_parallel=true"], "sequence_parallel needs parallel.tp > 1"),
    ],
)
def test_bad_layouts_are_user_errors(overrides, message):
    with pytest.raises(UserError, match=message):
        resolve_layout(_cfg(*overrides))


def test_interleaved_needs_microbatches_divisible_by_pp():
    cfg = _cfg(
        "model.num_layers=4",
        "parallel.pp=2",
        "parallel.vpp=2",
        "train.global_batch_size=12",
        "parallel.micro_batch_size=4",
    )
    with pytest.raises(UserError, match=r"micro-batches per step \(3\) divisible by PP=2"):
        resolve_layout(cfg, world_size=2)
