"""Real megatron-core training in this process, one rank, on the demo corpus."""

from __future__ import annotations

import json

import pytest

from llmctl.config import compose
from llmctl.errors import UserError

pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def tiny_run(demo_cache, tmp_path_factory):
    import torch

    from llmctl.run.rundir import create_run_dir
    from llmctl.train import run_in_process

    run_dir = tmp_path_factory.mktemp("run")
    cfg = compose(
        "tiny_cpu",
        [
            f"data.cache_dir={demo_cache}",
            f"train.run_dir={run_dir}",
            "train.train_iters=50",
            "train.lr=3e-3",
            "train.min_lr=3e-4",
            "train.eval_interval=25",
        ],
    )
    create_run_dir(cfg, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see the one_thread fixture in conftest.py
    try:
        return run_in_process(cfg, run_dir), run_dir
    finally:
        torch.set_num_threads(threads)


def test_loss_falls_over_50_steps(tiny_run):
    result, _ = tiny_run
    assert result.steps == 50 and len(result.losses) == 50
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-10:]) / 10
    assert 8.0 < first < 8.7  # about ln(4096) = 8.32 from a random init
    assert last < first - 1.0, (first, last)
    assert set(result.val_losses) == {25, 50}
    assert result.val_losses[50] < result.val_losses[25] < first


def test_run_dir_gets_metrics_and_perf(tiny_run):
    result, run_dir = tiny_run
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 51))
    assert [r["loss"] for r in records] == pytest.approx(result.losses)
    first = records[0]
    assert first["lr"] > 0 and first["grad_norm"] > 0 and first["tokens_per_s"] > 0
    assert records[-1]["consumed_samples"] == 50 * 8
    perf = json.loads((run_dir / "perf.json").read_text())
    assert perf["cluster"] == "local_cpu" and perf["layout"]["tp"] == 1
    assert perf["measured_peak_mem_gib"] is None  # host RSS is not device memory
    assert perf["tokens_per_s"] == pytest.approx(8 * 64 / perf["measured_step_s"])
    assert "| step time (s) |" in (run_dir / "perf.md").read_text()


def test_lr_warms_up_then_decays(tiny_run):
    _, run_dir = tiny_run
    lrs = [json.loads(x)["lr"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    peak = lrs.index(max(lrs))
    assert max(lrs) == pytest.approx(3e-3) and 3 <= peak <= 5
    assert lrs[-1] == pytest.approx(3e-4, rel=0.05)
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :], strict=False))


def test_parameter_count_matches_megatron_model(one_thread):
    """The config-side count (used for FLOPs) equals what megatron actually builds."""
    import torch.distributed as dist

    from llmctl.run.layout import resolve_layout
    from llmctl.run.precision import RECIPES
    from llmctl.train import cpu_compat, parallel
    from llmctl.train.model import build_model_chunks, count_parameters, transformer_config

    for family in (
        ["model.family=llama"],
        [
            "model.normalization=layernorm",
            "model.activation=gelu",
            "model.position_embedding=learned_absolute",
            "model.add_bias_linear=true",
        ],
    ):
        cfg = compose("tiny_cpu", family)
        parallel.init_distributed()
        try:
            layout = resolve_layout(cfg, 1)
            parallel.init_model_parallel(layout, 1, on_gpu=False)
            config = transformer_config(
                cfg.model, layout, cfg.precision, RECIPES["fp32"], on_gpu=False
            )
            (chunk,) = build_model_chunks(cfg.model, config, layout, use_te=False, seed=1)
            assert sum(p.numel() for p in chunk.parameters()) == count_parameters(cfg.model)
        finally:
            parallel.teardown(destroy_process_group=True)
            cpu_compat.uninstall()
    assert not dist.is_initialized()


def test_gpu_only_precision_fails_before_training(demo_cache, tmp_path):
    from llmctl.train import run_in_process

    cfg = compose("tiny_cpu", [f"data.cache_dir={demo_cache}", "precision=fp8_delayed"])
    with pytest.raises(UserError, match="precision=fp8_delayed needs a CUDA GPU"):
        run_in_process(cfg, tmp_path)
