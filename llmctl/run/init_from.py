"""`checkpoint.init_from` sources, checked before any rank starts (no torch).

The source is an `llmctl import hf` output directory or any run directory (its `latest`
checkpoint), a checkpoint directory `.../checkpoints/iter_N`, or `hf:DIR`, a Hugging Face
model directory that rank 0 imports into `RUN_DIR/init_from/` first (`llmctl.train.init_from`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.run import ckpt_store as store

if TYPE_CHECKING:
    from llmctl.config.schema import ModelConfig

HF_PREFIX = "hf:"
IMPORT_SUBDIR = "init_from"


def checkpoint_dir(source: Path) -> Path:
    """The `iter_N` directory a path names: itself, or its (checkpoints/) latest.

    Raises:
        UserError: No committed checkpoint there.
    """
    if store.step_of(source.name) is not None:
        return source
    root = source / "checkpoints" if (source / "checkpoints").is_dir() else source
    latest = store.read_latest(root) if root.is_dir() else None
    steps = store.committed_steps(root) if root.is_dir() else []
    if not steps:
        raise UserError(f"checkpoint.init_from={source}: no committed checkpoint there")
    return root / store.iter_name(latest if latest in steps else steps[-1])


def check_same_model(saved: dict[str, Any], model: ModelConfig, where: Path) -> None:
    """Every architecture field the checkpoint records equals the run's.

    Raises:
        UserError: Naming the first field that differs.
    """
    for name, value in (saved.get("model") or {}).items():
        have = getattr(model, name, None)
        have = getattr(have, "value", have)
        if value != have and not (isinstance(value, float | int) and have == value):
            raise UserError(
                f"checkpoint.init_from={where} holds a model with model.{name}={value}, this run "
                f"has {have}; use the recipe.yaml or model.yaml that `llmctl import hf` wrote"
            )


def check_checkpoint_source(spec: str, model: ModelConfig) -> str:
    """A checkpoint source (not `hf:`) exists, is committed and holds `model`.

    Returns:
        The checkpoint directory checked.

    Raises:
        UserError: A missing or unreadable source, or the first model field that differs.
    """
    ckpt = checkpoint_dir(Path(spec).expanduser())
    try:
        saved = json.loads((ckpt / store.TRAIN_STATE).read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"checkpoint.init_from={ckpt}: cannot read {store.TRAIN_STATE} ({e})"
        ) from e
    check_same_model(saved, model, ckpt)
    return str(ckpt)
