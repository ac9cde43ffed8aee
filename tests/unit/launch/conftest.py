"""Fixtures for launcher tests: configs with a pinned interpreter, golden-file comparison."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "launch"
PYTHON = "/opt/venv/bin/python"


@pytest.fixture
def make_cfg() -> Callable[..., Any]:
    """Compose tiny_cpu with overrides; pin launcher.python so renderings are stable."""
    from llmctl.config import compose

    def make(*overrides: str, recipe: str = "tiny_cpu", **launcher: Any) -> Any:
        cfg = compose(recipe, list(overrides))
        cfg.launcher.python = PYTHON
        for key, value in launcher.items():
            setattr(cfg.launcher, key, value)
        return cfg

    return make


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    """Compare text with tests/golden/launch/NAME; LLMCTL_UPDATE_GOLDEN=1 rewrites the file."""

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if os.environ.get("LLMCTL_UPDATE_GOLDEN") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.is_file(), f"missing golden file {path}: run with LLMCTL_UPDATE_GOLDEN=1"
        assert text == path.read_text(), (
            f"rendering differs from {path}; if the change is intended, rerun with "
            "LLMCTL_UPDATE_GOLDEN=1 and review the diff"
        )

    return check
