"""Shared paths for topology tests."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"


@pytest.fixture
def fixtures() -> Path:
    """The folder of real published `nvidia-smi topo -m` outputs (see SOURCE.md there)."""
    return FIXTURES
