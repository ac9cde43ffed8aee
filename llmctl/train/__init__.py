"""The megatron-core training runner: model, parallel state, optimizer, data, loop, metrics.

Importing this package is cheap (no torch, no megatron-core); `run_in_process` imports them
when called. Processes start through `python -m llmctl.train.entry RUN_DIR`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.train.loop import Checkpointer, TrainResult


def run_in_process(
    cfg: RootConfig, run_dir: str | Path, *, checkpointer: Checkpointer | None = None
) -> TrainResult:
    """Train with one rank inside this process; see `llmctl.train.run.run_in_process`."""
    from llmctl.train.run import run_in_process as _run

    return _run(cfg, run_dir, checkpointer=checkpointer)


def __getattr__(name: str) -> Any:
    if name == "TrainResult":
        from llmctl.train.loop import TrainResult

        return TrainResult
    raise AttributeError(name)


__all__ = ["TrainResult", "run_in_process"]
