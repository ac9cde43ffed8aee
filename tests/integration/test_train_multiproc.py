"""Multi-process training (torchrun, gloo) reaches the TP=1 losses for the same seed and data.

Tolerance: every logged loss within 2e-5 absolute (about 2.5e-6 relative at loss ~8) of the
single-rank run. Why not exact: TP splits each GEMM and sums partial products with an
all-reduce, and DP averages gradients across ranks, so fp32 additions happen in a different
order (rounding ~1e-7 relative per operation, compounding over steps). PP and VPP move whole
layers and so match to the last bit on CPU; the bound is shared for simplicity. Measured
differences on this machine: 0 for DP=2 (plain and distributed optimizer), PP=2 and
PP=2xVPP=2, <= 1e-6 for TP=2.
The initial model is layout-independent because llmctl seeds each layer from its global layer
number (see llmctl/train/model.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.run.rundir import create_run_dir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

STEPS = 6
BASE = [
    "model.num_layers=4",
    f"train.train_iters={STEPS}",
    "train.eval_interval=3",
    "train.lr=3e-3",
    "train.warmup_iters=2",
]


FSDP = ["parallel.optimizer_sharding=full"]


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmctl.data.demo import prepare_demo_data

    cache = tmp_path_factory.mktemp("demo-cache")
    prepare_demo_data(cache)
    return cache


def _losses(run_dir: Path) -> tuple[list[float], dict[int, float]]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    vals = {r["step"]: r["val_loss"] for r in records if r["val_loss"] is not None}
    return [r["loss"] for r in records], vals


def _run(argv: list[str], timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """Run in a new session; on timeout kill the whole group (torchrun and its workers)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _torchrun(run_dir: Path, nproc: int) -> subprocess.CompletedProcess[str]:
    return _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            "--standalone",
            "-m",
            "llmctl.train.entry",
            str(run_dir),
        ]
    )


@pytest.fixture(scope="module")
def baseline(demo_cache, tmp_path_factory):
    import torch

    from llmctl.train import run_in_process

    run_dir = tmp_path_factory.mktemp("tp1")
    cfg = compose("tiny_cpu", [*BASE, f"data.cache_dir={demo_cache}", f"train.run_dir={run_dir}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the torchrun workers (OMP_NUM_THREADS=1)
    try:
        run_in_process(cfg, run_dir)
    finally:
        torch.set_num_threads(threads)
    return _losses(run_dir)


@pytest.mark.parametrize(
    ("name", "overrides", "nproc"),
    [
        ("tp2", ["parallel.tp=2"], 2),
        ("dp2", ["parallel.dp=2"], 2),
        # megatron's distributed optimizer (ZeRO-1): reduce-scatter grads, all-gather params.
        ("dp2_zero1", ["parallel.dp=2", "parallel.optimizer_sharding=distributed"], 2),
        # 1F1B with 4 micro-batches (warm-up, steady state, cool-down all run).
        ("pp2", ["parallel.pp=2", "parallel.micro_batch_size=2"], 2),
        # Interleaved 1F1B: 4 micro-batches on PP=2 with VPP=2 reach its steady state.
        ("pp2_vpp2", ["parallel.pp=2", "parallel.vpp=2", "parallel.micro_batch_size=2"], 2),
        # FSDP (megatron-core's torch FSDP2 wrapper): parameters, grads and Adam state
        # sharded over DP, alone, with TP and with PP (checkpoints: test_ckpt_multiproc.py).
        ("dp2_fsdp", ["parallel.dp=2", *FSDP], 2),
        ("tp2_dp2_fsdp", ["parallel.tp=2", "parallel.dp=2", *FSDP], 4),
        (
            "pp2_dp2_fsdp",
            ["parallel.pp=2", "parallel.dp=2", "parallel.micro_batch_size=2", *FSDP],
            4,
        ),
    ],
)
def test_layout_matches_tp1(name, overrides, nproc, baseline, demo_cache, tmp_path):
    run_dir = tmp_path / name
    cfg = compose(
        "tiny_cpu", [*BASE, *overrides, f"data.cache_dir={demo_cache}", f"train.run_dir={run_dir}"]
    )
    create_run_dir(cfg, None)
    proc = _torchrun(run_dir, nproc)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses, vals = _losses(run_dir)
    base_losses, base_vals = baseline
    assert losses == pytest.approx(base_losses, abs=2e-5)
    assert vals.keys() == base_vals.keys()
    assert list(vals.values()) == pytest.approx(list(base_vals.values()), abs=2e-5)
    assert losses[-1] < losses[0]
    for rank in range(nproc):
        assert (run_dir / "logs" / f"rank{rank}.log").is_file()
    perf = json.loads((run_dir / "perf.json").read_text())
    assert perf["num_devices"] == nproc and perf["tokens_per_s"] > 0
    if "full" in " ".join(overrides):  # each rank holds 1/DP of its parameters, not a copy
        for rank in range(nproc):
            log = (run_dir / "logs" / f"rank{rank}.log").read_text()
            held = re.search(r"FSDP: this rank holds (\d+) of (\d+) parameter elements", log)
            assert held, log[-2000:]
            assert int(held[1]) * 2 == pytest.approx(int(held[2]), rel=0.01)


def test_bad_input_exits_2_with_one_line(tmp_path):
    """A missing prefix stops the entry (plain process) before megatron is even imported."""
    bad = tmp_path / "bad"
    create_run_dir(
        compose("tiny_cpu", [f"data.prefixes=[{tmp_path}/missing]", f"train.run_dir={bad}"]), None
    )
    proc = _run([sys.executable, "-m", "llmctl.train.entry", str(bad)], 120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "missing.bin not found" in proc.stderr
    assert "Traceback" not in proc.stderr
