"""Reading a Hugging Face model directory's config and safetensors headers without loading it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.hf import modeldir


def test_not_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"no config\.json"):
        modeldir.read_config(tmp_path)
    with pytest.raises(UserError, match=r"no \*\.safetensors"):
        modeldir.read_tensors(tmp_path)
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(UserError, match="not a safetensors file"):
        modeldir.read_tensors(tmp_path)
