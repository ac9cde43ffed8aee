"""`checkpoint.init_from` source resolution and the model check (no torch, no megatron)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.init_from import check_same_model, checkpoint_dir


def test_checkpoint_dir_follows_latest(tmp_path: Path) -> None:
    root = tmp_path / "run" / "checkpoints"
    for step in (10, 20):
        (root / f"iter_{step:07d}").mkdir(parents=True)
    (root / "latest").write_text("10\n")
    assert checkpoint_dir(tmp_path / "run") == root / "iter_0000010"
    assert checkpoint_dir(root / "iter_0000020") == root / "iter_0000020"
    with pytest.raises(UserError, match="no committed checkpoint there"):
        checkpoint_dir(tmp_path / "elsewhere")


def test_model_mismatch_names_the_field() -> None:
    model = compose("tiny_cpu", []).model
    saved = {"model": {"num_layers": 2, "hidden_size": 64, "normalization": "rmsnorm"}}
    check_same_model(saved, model, Path("ckpt"))
    saved["model"]["hidden_size"] = 128
    with pytest.raises(UserError, match=r"model.hidden_size=128, this run has 64"):
        check_same_model(saved, model, Path("ckpt"))
