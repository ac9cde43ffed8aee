"""Training in the test process, as the resume tests of several objectives do it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def train_losses(cfg: Any, run_dir: Path, create: bool = True) -> list[float]:
    """Train `cfg` in this process on one intra-op thread (see conftest.one_thread) and return
    its losses; `create` makes the run directory first (False: resume the one there)."""
    import torch

    from llmctl.run.rundir import create_run_dir
    from llmctl.train import run_in_process

    if create:
        create_run_dir(cfg, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return list(run_in_process(cfg, run_dir).losses)
    finally:
        torch.set_num_threads(threads)
