"""Shared test plumbing: GPU tests skip themselves without CUDA; `run_main` runs the console
script in-process."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

# W&B tracking (on by default when wandb is installed) is tested on its own in
# tests/unit/train/test_wandb.py; every other run, in-process or in rank processes that inherit
# this environment, leaves it off.
os.environ.setdefault("LLMCTL_WANDB", "off")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Under pytest-xdist (`make test` runs tests/unit with `-n 2 --dist loadgroup`), these tests
# share one worker, one after the other: they start processes, a SLURM job or network
# namespaces, or time what they run, so two of them side by side would fight for the same
# cluster or cores.
SERIAL = ("slurm", "netns", "multiproc", "slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    serial = pytest.mark.xdist_group("serial")
    for item in items:
        if any(m in item.keywords for m in SERIAL) or "integration" in item.path.parts:
            item.add_marker(serial)


@pytest.fixture
def run_main(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run `llmctl ARGV` through the console entry point (`llmctl.cli.main:main`) in this
    process, as a user's shell would; returns (exit code, stdout, stderr)."""
    from llmctl.cli.main import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["llmctl", *argv])
        try:
            main()
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
