"""Pure rules of the hang watchdog and the divergence policy (llmctl.run.hang, .divergence,
.health) and the validation of `train.health`."""

from __future__ import annotations

import math

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run import hang
from llmctl.run.divergence import DivergenceRule
from llmctl.run.health import append_event, last_hang_line, read_events


def test_reference_step_is_the_larger_of_plan_and_steady_median() -> None:
    assert hang.reference_step_s(None, []) is None
    assert hang.reference_step_s(None, [9.0, 9.0]) is None  # warm-up steps only
    assert hang.reference_step_s(None, [9.0, 9.0, 1.0, 3.0, 2.0]) == 2.0
    assert hang.reference_step_s(0.5, [9.0, 9.0, 1.0, 3.0, 2.0]) == 2.0
    assert hang.reference_step_s(4.0, [9.0, 9.0, 1.0]) == 4.0  # a plan that overestimates


def test_timeout_is_factor_times_step_times_units_with_a_floor() -> None:
    assert hang.hang_timeout_s(None, 10, 300) == 300
    assert hang.hang_timeout_s(2.0, 10, 5) == 20
    assert hang.hang_timeout_s(2.0, 10, 5, units=3) == 60  # a validation pass follows
    assert hang.hang_timeout_s(0.1, 10, 5) == 5
    assert hang.hang_timeout_s(None, 10, 5, units=math.inf) == math.inf  # untimed span


def _beat(rank: int, step: int, written: float, host: str = "h0") -> hang.Heartbeat:
    return hang.Heartbeat(rank=rank, host=host, pid=100 + rank, step=step,
                          progress_unix=written - 1, written_unix=written)  # fmt: skip


def test_culprit_is_the_silent_rank_else_the_one_behind_else_all() -> None:
    before = [_beat(0, 5, 10.0), _beat(1, 5, 10.0), _beat(2, 5, 10.0)]
    after = [_beat(0, 5, 12.0), _beat(1, 5, 10.0), _beat(2, 5, 12.0)]
    stuck = hang.unresponsive(before, after)
    assert stuck == [1]
    assert [b.rank for b in hang.culprits(after, stuck)] == [1]
    behind = [_beat(0, 6, 12.0), _beat(1, 5, 12.0), _beat(2, 6, 12.0)]
    assert [b.rank for b in hang.culprits(behind, [])] == [1]
    assert [b.rank for b in hang.culprits(after, [])] == [0, 1, 2]
    assert hang.unresponsive(before, after[:1]) == [1, 2]  # vanished heartbeats: silent too


def test_hang_line_and_heartbeat_round_trip(tmp_path) -> None:
    (tmp_path / hang.HEARTBEAT_DIR).mkdir(parents=True)
    hang.write_heartbeat(tmp_path, _beat(1, 7, 50.0, host="node3"))
    (got,) = hang.read_heartbeats(tmp_path, range(4))
    assert got == _beat(1, 7, 50.0, host="node3")
    line = hang.hang_line([got], 41.6, tmp_path / "hangs" / "step7-x")
    assert line == f"rank 1 on node3 made no progress for 42s; stacks in {tmp_path}/hangs/step7-x/"


def test_launcher_line_is_the_first_detection_of_the_newest_hang(tmp_path) -> None:
    assert last_hang_line(tmp_path) is None
    append_event(tmp_path, {"event": "hang", "stacks": "a", "detected_unix": 1, "line": "old"})
    append_event(tmp_path, {"event": "divergence", "step": 3})
    append_event(tmp_path, {"event": "hang", "stacks": "b", "detected_unix": 9, "line": "second"})
    append_event(tmp_path, {"event": "hang", "stacks": "b", "detected_unix": 5, "line": "first"})
    assert last_hang_line(tmp_path) == "first"
    assert [e["event"] for e in read_events(tmp_path)] == ["hang", "divergence", "hang", "hang"]


def test_divergence_rule_nan_inf_and_spikes_after_the_window() -> None:
    rule = DivergenceRule(spike_factor=3.0, spike_window=3)
    assert rule.verdict(math.nan, 1.0) == "loss is nan"
    assert rule.verdict(2.0, math.inf) == "grad norm is inf"
    assert rule.verdict(100.0, 1.0) is None  # no history yet: the rule is silent
    for x in (2.0, 2.2, 50.0):  # one spike let through does not move the median much
        rule.accept(x)
    assert rule.verdict(6.5, 1.0) is None
    assert rule.verdict(6.7, None) == "loss 6.7 > 3 x 2.2 (median of the last 3 steps)"
    assert DivergenceRule(0.0, 1).verdict(1e9, 1.0) is None  # spike rule off


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.health.hang_floor_s=0", "train.health.hang_factor and train.health.hang_floor_s"),
        ("train.health.spike_factor=0.5", "train.health.spike_factor must be 0 (off) or > 1"),
        ("train.health.spike_window=0", "train.health.spike_window must be >= 1"),
    ],
)
def test_bad_health_values_are_one_line(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compose("tiny_cpu", [override])


def test_health_defaults() -> None:
    h = compose("tiny_cpu", []).train.health
    assert h.watchdog is True and h.hang_factor == 10 and h.hang_floor_s == 300
    assert str(h.on_divergence) == "stop" and h.spike_factor == 0
