"""Fixtures of the quantization unit tests (builders in quant_fakes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from quant_fakes import write_data, write_hf_dir


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    return write_hf_dir(tmp_path / "hf")


@pytest.fixture
def data(tmp_path: Path) -> str:
    return write_data(tmp_path / "d_text_document", high=250)
