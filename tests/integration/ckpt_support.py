"""Helpers of the checkpoint integration tests: a corpus, run directories, training processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def make_corpus(prefix: Path) -> Path:
    """Write a 400-document indexed dataset (int32 tokens < 4096) with megatron's builder."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(400):
        n, start = int(rng.integers(20, 200)), int(rng.integers(0, 4000))
        tokens = (start + int(rng.integers(1, 7)) * np.arange(n)) % 4000 + 1
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def base_overrides(corpus: Path, iters: int) -> list[str]:
    """Overrides of the tiny recipe shared by the checkpoint tests."""
    return [
        f"train.train_iters={iters}",
        f"train.lr_decay_iters={iters}",
        "train.warmup_iters=2",
        "train.lr=3e-3",
        "train.log_interval=1",
        "train.eval_interval=0",
        f"data.prefixes=[{corpus}]",
        f"data.cache_dir={corpus.parent / 'cache'}",
    ]


def write_run(run_dir: Path, overrides: list[str]) -> Path:
    """Compose the tiny recipe with `overrides` and write the run directory's config."""
    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir

    cfg = compose("tiny_cpu", [*overrides, f"train.run_dir={run_dir}"])
    return create_run_dir(cfg, None)


def child_env() -> dict[str, str]:
    """Environment of a training process: this checkout first, one thread per process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(OMP_NUM_THREADS="1", LLMCTL_WANDB="off", PYTHONWARNINGS="ignore")
    return env


def start_entry(
    run_dir: Path,
    nproc: int = 1,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start `python -m llmctl.train.entry RUN_DIR` (under torchrun when nproc > 1).

    The process leads a new session so a test can kill the whole run (writers included).
    """
    if nproc == 1 and not extra:
        argv = [sys.executable, "-m", "llmctl.train.entry", str(run_dir)]
    else:
        argv = [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            "--standalone", *(extra or []), "-m", "llmctl.train.entry", str(run_dir),
        ]  # fmt: skip
    log = open(run_dir / "process.log", "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        argv,
        env={**child_env(), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from metrics.jsonl (later lines win: a resumed run rewrites its steps)."""
    import json

    out: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip():
            row = json.loads(line)
            out[int(row["step"])] = float(row["loss"])
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a started run and every process under it (torchrun puts ranks in new sessions)."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=30)


def server_module() -> Any:
    """benchmarks/s3_server.py (the `weed mini` helper), loaded once per process."""
    import importlib.util
    import sys

    if "s3_server" not in sys.modules:
        path = REPO / "benchmarks" / "s3_server.py"
        spec = importlib.util.spec_from_file_location("s3_server", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["s3_server"]
