"""Divergence policy `stop` through the real CLI and local launcher (torchrun, DP2 on CPU).

lr=1e30 turns the gradients NaN at step 2: both ranks must reach the same verdict and stop
(no rank left waiting in a collective), the run must end with exit code 4 and one line, record
the event, and leave only the checkpoint of step 1, which holds no NaN.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from ckpt_support import base_overrides, make_corpus
from run_procs import assert_no_process_left, kill_marked, new_mark, start_cli

from llmctl.run import ckpt_store as store
from llmctl.run.health import EXIT_DIVERGED, read_events

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def test_nan_grad_norm_stops_with_exit_4_and_no_bad_checkpoint(tmp_path: Path) -> None:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    corpus = make_corpus(tmp_path / "data" / "corpus")
    run_dir, mark, log = tmp_path / "run", new_mark(), tmp_path / "cli.log"
    args = ["train", "recipe=tiny_cpu", "launcher=local", f"train.run_dir={run_dir}",
            *base_overrides(corpus, 10), "train.lr=1e30", "train.warmup_iters=0",
            "train.clip_grad=0", "checkpoint.interval=1", "parallel.dp=2"]  # fmt: skip
    proc = start_cli(args, mark, log)
    try:
        rc = proc.wait(timeout=300)
        assert_no_process_left(mark, 30)
    finally:
        kill_marked(mark)
    out = log.read_text()
    assert rc == EXIT_DIVERGED, out[-3000:]
    line = (
        "divergence at step 2 (grad norm is nan): stopped (train.health.on_divergence=stop); "
        "newest checkpoint: step 1, without the divergent step"
    )
    assert f"run failed (exit {EXIT_DIVERGED}): {line}" in out, out[-3000:]
    for rank in (0, 1):  # each rank stopped on its own verdict, none was killed waiting
        assert f"llmctl: rank {rank} exits {EXIT_DIVERGED}: {line}" in out, out[-3000:]
    (event,) = read_events(run_dir)
    assert (event["event"], event["step"], event["policy"]) == ("divergence", 2, "stop")
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 2 and last["events"][0]["line"] == line
    assert store.committed_steps(run_dir / "checkpoints") == [1]
    dcp_to_torch_save(str(run_dir / "checkpoints" / "iter_0000001"), str(tmp_path / "c.pt"))
    sd = torch.load(tmp_path / "c.pt", weights_only=False)
    weights = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    assert "embedding.word_embeddings.weight" in weights, list(sd)[:5]
    assert all(v.isfinite().all() for v in weights.values() if v.is_floating_point())
