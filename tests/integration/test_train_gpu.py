"""GPU-only training paths: Transformer Engine spec, bf16 and FP8. Skipped without CUDA."""

from __future__ import annotations

import json

import pytest

from llmctl.config import compose

pytestmark = pytest.mark.gpu


def _has_te() -> bool:
    from llmctl.run.precision import has_transformer_engine

    return has_transformer_engine()


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
    from llmctl.data.demo import prepare_demo_data

    cache = tmp_path_factory.mktemp("demo-cache")
    prepare_demo_data(cache)
    return cache


@pytest.mark.parametrize("precision", ["bf16", "fp8_delayed", "fp8_current"])
def test_tiny_trains_on_gpu(precision, demo_cache, tmp_path):
    from llmctl.train import run_in_process

    if precision.startswith("fp8") and not _has_te():
        pytest.skip("Transformer Engine not installed")
    cfg = compose(
        "tiny_cpu",
        [
            "cluster=dgx_h200",
            "cluster.gpus_per_node=1",
            f"precision={precision}",
            "model.hidden_size=128",
            "model.ffn_hidden_size=512",
            "train.train_iters=30",
            "train.lr=3e-3",
            "train.eval_interval=15",
            f"data.cache_dir={demo_cache}",
        ],
    )
    result = run_in_process(cfg, tmp_path)
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5 - 0.5
    perf = json.loads((tmp_path / "perf.json").read_text())
    assert perf["measured_peak_mem_gib"] > 0 and perf["mfu"] is not None


def test_sequence_parallel_on_one_gpu_is_refused(demo_cache, tmp_path):
    """SP needs TP > 1: a one-GPU run with SP is a UserError, not a silent no-op."""
    from llmctl.errors import UserError
    from llmctl.train import run_in_process

    cfg = compose(
        "tiny_cpu",
        [
            "cluster=dgx_h200",
            "cluster.gpus_per_node=1",
            "precision=bf16",
            "parallel.sequence_parallel=true",
            f"data.cache_dir={demo_cache}",
        ],
    )
    with pytest.raises(UserError, match=r"sequence_parallel needs parallel\.tp > 1"):
        run_in_process(cfg, tmp_path)
