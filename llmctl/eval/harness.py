"""lm-evaluation-harness, called as a library, exactly as `python -m lm_eval` would call it.

Why the numbers match the harness's own command line: `lm_eval --model hf --model_args
pretrained=DIR,dtype=float32 --tasks T --include_path D --device cpu` builds its `HFLM` with
`HFLM.create_from_arg_string(model_args, {batch_size, max_batch_size, device})` and runs
`simple_evaluate` with the harness's default seeds; llmctl builds the model through the same
call with the same strings and defaults, and passes a `TaskManager` over the same folders. The
`HFLM`'s transformers model is then reused for llmctl's own perplexity, so a model is loaded
once. `command_line` renders the equivalent harness command (shown by `--dry-run`).

The harness imports torch, transformers and datasets: every import is inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DTYPE = "float32"
METRIC_SUFFIX = ",none"  # the harness's filter name on each metric key


def model_args(model_dir: Path) -> str:
    """The harness's `--model_args` for a local model directory (absolute), fp32 compute."""
    return f"pretrained={model_dir},dtype={DTYPE}"


def command_line(
    model_dir: Path,
    tasks: tuple[str, ...],
    include_paths: list[Path],
    *,
    device: str,
    batch_size: int,
    limit: int | None,
) -> list[str]:
    """`python -m lm_eval ...` argv that computes the same numbers."""
    argv = ["python", "-m", "lm_eval", "--model", "hf", "--model_args", model_args(model_dir)]
    argv += ["--tasks", ",".join(tasks), "--device", device, "--batch_size", str(batch_size)]
    for path in include_paths:
        argv += ["--include_path", str(path)]
    return [*argv, *(["--limit", str(limit)] if limit is not None else [])]


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No hub for the harness, transformers or datasets while the block runs."""
    keys = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_lm(model_dir: Path, device: str, batch_size: int) -> Any:
    """The harness's `hf` model, built as its command line builds it."""
    from lm_eval.models.huggingface import HFLM

    extra = {"batch_size": batch_size, "max_batch_size": None, "device": device}
    return HFLM.create_from_arg_string(model_args(model_dir), extra)


def task_manager(include_paths: list[Path]) -> Any:
    """Only llmctl's and the user's task folders (hub tasks cannot run offline)."""
    from lm_eval.tasks import TaskManager

    paths = [str(p) for p in include_paths]
    return TaskManager(include_path=paths, include_defaults=False, metadata={})


def evaluate(
    lm: Any, tasks: tuple[str, ...], manager: Any, *, limit: int | None
) -> dict[str, dict[str, float]]:
    """Run the tasks; task -> {metric: value} (stderr keys included), as the harness reports.

    stdout is sent to stderr meanwhile: the harness and transformers print, and llmctl's
    stdout carries only its result.
    """
    from lm_eval import simple_evaluate

    with contextlib.redirect_stdout(sys.stderr):
        out = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit)
    assert out is not None  # None only on non-zero ranks of a distributed run
    return {task: metrics_of(out["results"][task]) for task in tasks}


def metrics_of(result: dict[str, Any]) -> dict[str, float]:
    """{metric: value} of one task's harness result (`"acc,none": 0.16` -> `"acc": 0.16`)."""
    return {
        key.removesuffix(METRIC_SUFFIX): float(value)
        for key, value in result.items()
        if key.endswith(METRIC_SUFFIX) and isinstance(value, int | float)
    }
