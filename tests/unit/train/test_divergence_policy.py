"""Divergence policy on real megatron-core training in this process (one rank, tiny model).

The runs really diverge: a learning rate of 1e30 turns the gradients NaN at step 2; a warm-up
to 30 makes the loss jump from ~8.3 to thousands. The oracle is what lands on disk: the
events, the metrics records and every committed checkpoint loaded back with torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.run.health import EXIT_DIVERGED, read_events

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.slow


def _tensors(ckpt_dir: Path, tmp: Path) -> dict[str, object]:
    """Every tensor of a committed torch_dist checkpoint (model and optimizer state)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{ckpt_dir.name}.pt"
    dcp_to_torch_save(str(ckpt_dir), str(out))
    flat: dict[str, object] = {}

    def walk(obj: object, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            flat[path] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}/{k}")
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                walk(v, f"{path}/{i}")

    walk(torch.load(out, weights_only=False), "")
    return flat


def _assert_all_finite(run_dir: Path, tmp: Path) -> list[int]:
    """No NaN/inf in any committed checkpoint; returns their steps."""

    from llmctl.run import ckpt_store as store

    steps = store.committed_steps(run_dir / "checkpoints")
    for step in steps:
        tensors = _tensors(run_dir / "checkpoints" / store.iter_name(step), tmp)
        assert any(k.endswith("word_embeddings.weight") for k in tensors), list(tensors)[:5]
        bad = [k for k, t in tensors.items() if t.is_floating_point() and not t.isfinite().all()]
        assert not bad, (step, bad)
    return steps


def _run(demo_cache: Path, run_dir: Path, overrides: list[str]):
    import torch

    from llmctl.run.rundir import create_run_dir
    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import make_checkpointer

    cfg = compose(
        "tiny_cpu",
        [
            f"data.cache_dir={demo_cache}",
            f"train.run_dir={run_dir}",
            "train.clip_grad=0",
            "train.eval_interval=0",
            "checkpoint.interval=1",
            "checkpoint.keep_last=20",
            *overrides,
        ],
    )
    create_run_dir(cfg, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_in_process(cfg, run_dir, checkpointer=make_checkpointer(cfg, run_dir))
    finally:
        torch.set_num_threads(threads)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_skip_drops_the_nan_batches_then_stops_at_the_limit(demo_cache, tmp_path):
    run_dir = tmp_path / "run"
    overrides = ["train.train_iters=8", "train.lr=1e30", "train.warmup_iters=0",
                 "train.health.on_divergence=skip", "train.health.max_divergences=2"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        _run(demo_cache, run_dir, overrides)
    assert stopped.value.code == EXIT_DIVERGED
    events = read_events(run_dir)
    assert [(e["step"], e["policy"]) for e in events] == [(2, "skip"), (3, "skip"), (4, "stop")]
    assert all(e["reason"].startswith("grad norm is nan") for e in events), events
    assert "2 divergent steps handled (train.health.max_divergences)" in events[-1]["reason"]
    records = _records(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [len(r.get("events", [])) for r in records] == [0, 1, 1, 1]
    assert records[2]["consumed_samples"] == 3 * 8  # the skipped batches are consumed
    # every committed checkpoint is finite; those of the skipped steps hold step 1's weights
    assert _assert_all_finite(run_dir, tmp_path) == [1, 2, 3]
    ckpts = run_dir / "checkpoints"
    one, three = (
        _tensors(ckpts / "iter_0000001", tmp_path),
        _tensors(ckpts / "iter_0000003", tmp_path),
    )
    weights = [k for k in one if "optimizer" not in k and k.endswith("weight")]
    assert weights and all(one[k].equal(three[k]) for k in weights)


def test_rollback_skips_the_window_and_the_run_finishes(demo_cache, tmp_path):
    run_dir = tmp_path / "run"
    # warm-up to lr 30 by step 3 (the loss jumps from ~8.3 to thousands), cosine decay to
    # 1e-3 by step 10: rolled back past each spike, the run trains on once the LR is sane
    overrides = ["train.train_iters=20", "train.lr=30", "train.warmup_iters=3",
                 "train.lr_decay_iters=10", "train.min_lr=1e-3",
                 "train.health.on_divergence=rollback", "train.health.spike_factor=2",
                 "train.health.spike_window=2", "train.health.max_divergences=10"]  # fmt: skip
    result = _run(demo_cache, run_dir, overrides)
    assert result.steps == 20
    events = read_events(run_dir)
    assert events and all(e["policy"] == "rollback" for e in events), events
    for e in events:
        back, (start, end) = e["rolled_back_to"], e["skipped_samples"]
        assert back <= e["step"] - 2  # never the checkpoint whose weights diverged
        assert (start, end) == (back * 8, e["step"] * 8)
        assert e["loss"] > 2 * 8.0 and "median of the last 2 steps" in e["reason"]
    records = _records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 21))
    assert records[-1]["consumed_samples"] == 20 * 8
    assert {r["step"] for r in records if r.get("events")} == {e["step"] for e in events}
    tail = [r["loss"] for r in records[-5:]]
    assert all(math.isfinite(x) and x < 8.4 for x in tail), tail  # trained on, not diverged
    assert _assert_all_finite(run_dir, tmp_path)[-1] == 20


def test_the_guarded_step_trains_exactly_as_megatrons_step(demo_cache, tmp_path):
    """On a healthy run (clip_grad=1, the default) the guard changes no number."""
    runs = {}
    for policy in ("off", "stop"):
        run_dir = tmp_path / policy
        overrides = ["train.train_iters=6", "train.clip_grad=1.0", "checkpoint.interval=0",
                     f"train.health.on_divergence={policy}"]  # fmt: skip
        _run(demo_cache, run_dir, overrides)
        runs[policy] = [(r["loss"], r["grad_norm"], r["lr"]) for r in _records(run_dir)]
    assert runs["stop"] == runs["off"] and len(runs["off"]) == 6
    assert not read_events(tmp_path / "stop")
