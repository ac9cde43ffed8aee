"""Loading a checkpoint: which one, whether it fits this run, and restoring the state.

Selection never trusts `latest`: every rank checksums a share of each candidate's files, newest
first, and all ranks agree (MAX all-reduce) before one is used. A candidate must then pass the
`.metadata` allowlist (`ckpt_safe`) and match this run's model; megatron-core loads (and reshards
where it can) the model and optimizer; llmctl restores the scheduler, the data position and,
on an unchanged layout, every rank's RNG states.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmctl.config.values import enum_value as _v
from llmctl.errors import UserError
from llmctl.train import ckpt_store as store
from llmctl.train.ckpt_rng import restore_rng
from llmctl.train.ckpt_save import _unwrap, sharded_state_dict

log = logging.getLogger("llmctl.train.checkpoint")

# Model fields that must match between a checkpoint and the run that loads it.
_ARCH_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "vocab_size", "normalization", "activation", "position_embedding",
    "tied_embeddings", "add_bias_linear", "num_experts",
)  # fmt: skip
_LAYOUT_DIMS = ("tp", "pp", "vpp", "cp", "ep", "dp")


def uses_torch_adam() -> bool:
    """Whether megatron's optimizer runs on torch's Adam (no Transformer Engine, no Apex)."""
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        try:
            import apex  # noqa: F401
        except Exception:
            return True
    return False


def check_optimizer_checkpointable(layout: Any) -> None:
    """Refuse distributed-optimizer checkpoints where megatron-core cannot reload them.

    Raises:
        UserError: On the torch-Adam path (CPU, or GPU without TE/Apex) with sharding on.
    """
    if layout.optimizer_sharding == "distributed" and uses_torch_adam():
        raise UserError(
            "checkpoint: parallel.optimizer_sharding=distributed cannot be checkpointed on "
            "megatron-core's torch-Adam path (no Transformer Engine or Apex, e.g. CPU): its "
            "checkpoints do not reload there; use parallel.optimizer_sharding=none or "
            "checkpoint.interval=0"
        )


def check_compatible(saved: dict[str, Any], cfg: Any, layout: Any) -> list[str]:
    """Compare a checkpoint's train_state with this run. Returns the layout dims that changed.

    Raises:
        UserError: If a model field differs (no layout change can load other weights), or the
            optimizer sharding changed.
    """
    saved_model = saved.get("model", {})
    for name in _ARCH_FIELDS:
        have = getattr(cfg.model, name, None)
        if name in saved_model and _v(saved_model[name]) != _v(have):
            raise UserError(
                f"checkpoint was saved with model.{name}={saved_model[name]}, this run has "
                f"{have}; a checkpoint only loads into the same model"
            )
    old = saved.get("layout", {})
    if old.get("optimizer_sharding", "none") != layout.optimizer_sharding:
        raise UserError(
            f"checkpoint: parallel.optimizer_sharding changed ({old.get('optimizer_sharding')} -> "
            f"{layout.optimizer_sharding}); the optimizer state cannot be converted"
        )
    return [d for d in _LAYOUT_DIMS if d in old and old[d] != getattr(layout, d)]


def newest_valid_step(
    root: Path, steps: list[int], rank: int, world: int, any_bad: Callable[[int], int]
) -> int | None:
    """Newest step whose checkpoint validates on every rank (each checksums a share).

    Args:
        root: The checkpoints directory.
        steps: Committed steps, oldest first (the same list on every rank).
        rank: This rank; world: the number of ranks (the CRC32 share).
        any_bad: MAX all-reduce of an int over the ranks.
    """
    for step in reversed(steps):
        v = store.validate(root / store.iter_name(step), crc_part=(rank, world))
        if not v.ok:
            log.warning("checkpoint %s is invalid (%s); skipping it", v.path.name, v.reason)
        if not any_bad(0 if v.ok else 1):
            return step
    return None


def load_checkpoint(state: Any, ckpt_dir: Path, cfg: Any, rank: int, world: int) -> int:
    """Load one (validated) checkpoint directory into `state`. Returns its step.

    Raises:
        UserError: A `.metadata` naming unsafe globals, another model, or a layout change
            megatron-core cannot reshard.
    """
    from megatron.core import dist_checkpointing

    from llmctl.train.ckpt_safe import load_metadata, weights_only_loads

    t0 = time.perf_counter()
    load_metadata(ckpt_dir / ".metadata")  # rejects a .metadata naming unsafe globals
    saved = json.loads((ckpt_dir / store.TRAIN_STATE).read_text())
    changed = check_compatible(saved, cfg, state.layout)
    sd = sharded_state_dict(state, is_loading=True)
    try:
        with weights_only_loads():
            loaded = dist_checkpointing.load(sd, str(ckpt_dir))
    except Exception as e:
        dims = ", ".join(f"{d} {saved['layout'][d]}->{getattr(state.layout, d)}" for d in changed)
        hint = f" (layout changed: {dims}; megatron-core cannot reshard this)" if dims else ""
        raise UserError(f"cannot load checkpoint {ckpt_dir}{hint}: {e}") from e
    _apply(state, loaded, saved)
    if not changed and saved.get("world_size") == world:
        restore_rng(json.loads((ckpt_dir / store.RNG_DIR / f"rank_{rank}.json").read_text()))
    elif rank == 0:
        log.warning("layout changed: RNG states start from this run's seeds, not the checkpoint's")
    log.info(
        "resumed from %s (step %d, %d samples) in %.2f s%s", ckpt_dir.name, saved["step"],
        saved["consumed_samples"], time.perf_counter() - t0,
        f"; resharded {', '.join(changed)}" if changed else "",
    )  # fmt: skip
    return int(saved["step"])


def _apply(state: Any, loaded: dict[str, Any], saved: dict[str, Any]) -> None:
    """Model chunks, optimizer, scheduler and data position from a loaded checkpoint."""
    chunks = [_unwrap(m) for m in state.model]
    if len(chunks) == 1:
        chunks[0].load_state_dict(loaded["model"])
    else:
        for i, chunk in enumerate(chunks):
            chunk.load_state_dict(loaded[f"model{i}"])
    state.optimizer.load_state_dict(loaded["optimizer"])
    sched = state.scheduler
    if hasattr(sched, "override_opt_param_scheduler"):
        sched.override_opt_param_scheduler = True  # this run's config wins; steps restored
    sched.load_state_dict(saved["scheduler"])
    state.set_position(int(saved["step"]), int(saved["consumed_samples"]))
