"""llmctl.run.straggler: which ranks are slow in a window, naming after K windows and clearing,
the run directory's files, the exclude policy's host list and the hostfile it thins, the
config checks, and the exporter's straggler series (CPU path: no GPU series)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.launch.hostfile import drop_excluded, parse_hostfile
from llmctl.run.straggler import (
    EXCLUDED_HOSTS_FILE,
    RankWindow,
    StragglerDetector,
    StragglerLog,
    current_stragglers,
    excluded_hosts,
    is_excluded,
    read_stragglers,
    record_excluded_host,
    slow_ranks,
    window_figure,
)


def _w(rank: int, compute: float, group: int = 0, host: str | None = None) -> RankWindow:
    return RankWindow(
        rank=rank, host=host or f"h{rank // 2}", group=group, compute_s=compute,
        reduce_s=0.1 - compute, step_s=0.1,
    )  # fmt: skip


def test_the_slow_rank_of_two_is_the_one_past_the_margin() -> None:
    assert slow_ranks([_w(0, 0.05), _w(1, 0.08)], 0.25) == {1: (0.08, 0.05)}
    assert slow_ranks([_w(0, 0.05), _w(1, 0.06)], 0.25) == {}  # 20 % < 25 %
    assert slow_ranks([_w(0, 0.06), _w(1, 0.05)], 0.1) == {0: (0.06, 0.05)}


def test_each_rank_is_compared_with_the_median_of_the_others_of_its_stage() -> None:
    ranks = [_w(0, 0.05), _w(1, 0.05), _w(2, 0.051), _w(3, 0.09)]
    assert slow_ranks(ranks, 0.25) == {3: (0.09, 0.05)}
    # Another pipeline stage does other work: compared only within its own group.
    staged = [_w(0, 0.05), _w(1, 0.05), _w(2, 0.2, group=1), _w(3, 0.2, group=1)]
    assert slow_ranks(staged, 0.25) == {}
    assert slow_ranks([_w(0, 0.05), _w(1, 0.9, group=1)], 0.25) == {}  # alone in its stage


def test_window_figure_is_the_lower_quartile() -> None:
    assert window_figure([0.1] * 7 + [9.0, 9.0, 9.0]) == 0.1  # bursts on 3 of 10 steps
    assert window_figure([0.3, 0.1, 0.2, 0.4]) == 0.1
    assert window_figure([0.5] * 10) == 0.5


def test_k_windows_in_a_row_name_and_k_normal_ones_clear() -> None:
    det = StragglerDetector(margin=0.25, windows=3)
    slow, even = [_w(0, 0.05), _w(1, 0.1)], [_w(0, 0.05), _w(1, 0.05)]
    assert det.observe(10, slow, first_step=1).named == []
    assert det.observe(20, even, first_step=11).named == []  # the streak is broken
    assert det.observe(30, slow, first_step=21).named == []
    assert det.observe(40, slow, first_step=31).named == []
    (s,) = det.observe(50, slow, first_step=41).named
    assert (s.rank, s.host, s.since_step, s.windows, s.ratio) == (1, "h0", 21, 3, 2.0)
    assert "straggler: rank 1 on host h0: compute 0.100 s" in s.line(10)
    assert det.observe(60, slow, first_step=51).named == []  # named once
    assert det.observe(70, even, first_step=61).cleared == []
    assert det.observe(80, even, first_step=71).cleared == []
    assert [c.rank for c in det.observe(90, even, first_step=81).cleared] == [1]
    assert det.current == {} and det.num_windows == 9 and det.num_slow == {1: 5}


def test_the_log_keeps_events_across_restarts(tmp_path: Path) -> None:
    det = StragglerDetector(margin=0.25, windows=1)
    ranks = [_w(0, 0.05), _w(1, 0.1)]
    log = StragglerLog(tmp_path, {"window_steps": 10})
    log.write(10, ranks, det.observe(10, ranks, first_step=1), det)
    data = read_stragglers(tmp_path)
    assert data is not None and data["window_steps"] == 10 and data["step"] == 10
    assert [(e["event"], e["rank"]) for e in data["events"]] == [("named", 1)]
    assert [r["slow"] for r in data["last_window"]] == [False, True]
    assert [s["rank"] for s in current_stragglers(tmp_path)] == [1]
    det2, log2 = StragglerDetector(margin=0.25, windows=1), StragglerLog(tmp_path, {})
    even = [_w(0, 0.05), _w(1, 0.05)]
    log2.write(20, even, det2.observe(20, even, first_step=11), det2)  # a restarted run
    assert len(read_stragglers(tmp_path)["events"]) == 1  # type: ignore[index]
    assert current_stragglers(tmp_path) == []
    (tmp_path / "stragglers.json").write_text("{cut sh")
    assert read_stragglers(tmp_path) is None and current_stragglers(tmp_path) == []


def test_exclude_records_the_host_once_and_the_hostfile_skips_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = parse_hostfile("node-1 slots=2\nnode-2.cluster slots=2\nnode-3\n")
    assert drop_excluded(hosts, tmp_path) == hosts  # nothing excluded: no file, no line
    det = StragglerDetector(margin=0.25, windows=1)
    (s,) = det.observe(
        10, [_w(0, 0.05, host="node-1"), _w(1, 0.1, host="node-2")], first_step=1
    ).named
    record_excluded_host(tmp_path, s, 10)
    record_excluded_host(tmp_path, s, 20)
    got = excluded_hosts(tmp_path)
    assert list(got) == ["node-2"] and got["node-2"]["step"] == 10 and got["node-2"]["rank"] == 1
    kept = drop_excluded(hosts, tmp_path)
    assert [h.name for h in kept] == ["node-1", "node-3"]
    assert "skipping host(s) node-2.cluster: excluded as stragglers" in capsys.readouterr().err
    (tmp_path / EXCLUDED_HOSTS_FILE).write_text(json.dumps({"hosts": []}))
    assert excluded_hosts(tmp_path) == {}


def test_short_names_match_but_addresses_only_whole() -> None:
    assert is_excluded("node-2", ["node-2.cluster"]) and is_excluded("node-2.a", ["node-2"])
    assert not is_excluded("node-20", ["node-2"])
    assert not is_excluded("10.0.0.2", ["10.0.0.3"]) and is_excluded("10.0.0.3", ["10.0.0.3"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.straggler.window_steps=-1", "train.straggler.window_steps must be >= 0"),
        ("train.straggler.margin=0", "train.straggler.margin must be > 0"),
        ("train.straggler.windows=0", "train.straggler.windows must be >= 1"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(override: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        compose("tiny_cpu", [override])  # composing validates


def test_the_exporter_shows_parts_and_named_ranks_without_gpu_series(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from llmctl.run.layout import resolve_layout
    from llmctl.run.prom import RankExporter

    cfg = compose("tiny_cpu", [f"train.run_dir={tmp_path}"])
    exp = RankExporter(
        cfg, tmp_path, resolve_layout(cfg, 1, None), rank=0, on_gpu=False, plan=None, ckpt=None
    )

    def values() -> dict[tuple[str, str | None, str | None], float]:
        return {
            (s.name, s.labels.get("rank"), s.labels.get("host")): s.value
            for fam in text_string_to_metric_families(exp.m.exposition().decode())
            for s in fam.samples
        }

    me = ("0", exp.m.labels["host"])
    assert ("llmctl_train_straggler", *me) not in values()  # before the first window: absent
    exp.step_parts(0.04, 0.01)
    exp.straggler(True)
    got = values()
    assert got["llmctl_train_last_step_compute_seconds", *me] == 0.04
    assert got["llmctl_train_last_step_reduce_seconds", *me] == 0.01
    assert got["llmctl_train_straggler", *me] == 1
    exp.straggler(False)
    assert values()["llmctl_train_straggler", *me] == 0
    names = {k[0] for k in got}
    assert not any(n.startswith("llmctl_gpu_") for n in names)  # CPU: absent, not 0
    assert "llmctl_train_last_step_busy_seconds" not in names  # CPU: schedstat's, set by step()
    exp.close()


def test_gpu_utilization_is_absent_where_nvml_cannot_reach_a_gpu() -> None:
    import torch

    from llmctl.run.prom import _nvml_utilization

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: this checks the path without one")
    assert _nvml_utilization(0) is None  # NVML (or CUDA) unavailable: no gauge, no error
