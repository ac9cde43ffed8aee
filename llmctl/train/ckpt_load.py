"""Loading a checkpoint: which one, whether it fits this run, and restoring the state.

Selection never trusts `latest`: every rank checksums a share of each candidate's files, newest
first, and all ranks agree (MAX all-reduce) before one is used. A candidate must then pass the
`.metadata` allowlist (`ckpt_safe`) and match this run's model; megatron-core loads (and reshards
where it can) the model and optimizer; llmctl restores the scheduler, the data position and,
on an unchanged layout, every rank's RNG states.

Selection validates through the storage interface (`ckpt_store`); loading reads the chosen
checkpoint as a local directory (megatron-core's `dist_checkpointing.load`, the JSON files):
on POSIX the committed directory itself. An object-store backend has to download it first.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.run import ckpt_store as store
from llmctl.run.ckpt_compat import check_compatible
from llmctl.run.layout import layout_record
from llmctl.train.ckpt_rng import restore_rng
from llmctl.train.ckpt_save import _unwrap, sharded_state_dict

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

log = logging.getLogger("llmctl.train.checkpoint")


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


def load_checkpoint(state: Any, ckpt_dir: Path, cfg: RootConfig, rank: int, world: int) -> int:
    """Load one (validated) checkpoint directory into `state`. Returns its step.

    Raises:
        UserError: A `.metadata` naming unsafe globals, another model, or a layout change
            megatron-core cannot reshard.
    """
    from megatron.core import dist_checkpointing

    from llmctl.run.ckpt_safe import load_metadata, weights_only_loads

    t0 = time.perf_counter()
    load_metadata(ckpt_dir / ".metadata")  # rejects a .metadata naming unsafe globals
    saved = json.loads((ckpt_dir / store.TRAIN_STATE).read_text())
    changed = check_compatible(saved, cfg, state.layout)
    sd = sharded_state_dict(state, is_loading=True)
    try:
        with weights_only_loads():
            loaded = dist_checkpointing.load(sd, str(ckpt_dir))
    except Exception as e:
        now = layout_record(state.layout, cfg.train.global_batch_size)  # the saved form
        dims = ", ".join(f"{d} {saved['layout'][d]}->{now[d]}" for d in changed)
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


def _load_fsdp_shards(chunk: Any, loaded: dict[str, Any]) -> None:
    """FSDP: each parameter's local shard from the checkpoint (megatron-core built the
    sharded state dict on the DTensors' local tensors; `load_state_dict` would compare them
    with the whole parameters' shapes).

    Raises:
        UserError: A parameter of the model missing from the checkpoint, or a shape mismatch.
    """
    import torch

    params = chunk.state_dict(keep_vars=True)
    with torch.no_grad():
        for key, target in params.items():
            if not isinstance(target, torch.Tensor):
                continue
            if key not in loaded:
                raise UserError(f"checkpoint has no {key} for this FSDP model")
            local = getattr(target, "_local_tensor", target)
            value = loaded[key]
            if tuple(value.shape) != tuple(local.shape):
                raise UserError(
                    f"checkpoint {key}: shard shape {tuple(value.shape)}, this rank holds "
                    f"{tuple(local.shape)}"
                )
            if value.data_ptr() != local.data_ptr():
                local.copy_(value)


def _fsdp_optimizer_state_as_dtensors(optimizer: Any) -> None:
    """FSDP: torch's `Optimizer.load_state_dict` leaves the loaded Adam moments as the plain
    local shards the checkpoint held; the next step needs them as DTensors laid out like their
    (DTensor) parameters ("got mixed torch.Tensor and DTensor")."""
    import torch
    from torch.distributed.tensor import DTensor

    for opt in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        for param, st in opt.optimizer.state.items():
            if not isinstance(param, DTensor):
                continue
            for key, value in st.items():
                if (
                    isinstance(value, torch.Tensor)
                    and not isinstance(value, DTensor)
                    and (value.dim() > 0)
                ):
                    st[key] = DTensor.from_local(
                        value, param.device_mesh, param.placements, run_check=False,
                        shape=param.shape, stride=param.stride(),
                    )  # fmt: skip


def _apply(state: Any, loaded: dict[str, Any], saved: dict[str, Any]) -> None:
    """Model chunks, optimizer, scheduler and data position from a loaded checkpoint."""
    from llmctl.train.lora import load_view  # LoRA: the adapters only

    chunks = [_unwrap(m) for m in state.model]
    load = _load_fsdp_shards if state.layout.optimizer_sharding == "full" else load_view
    if len(chunks) == 1:
        load(chunks[0], loaded["model"])
    else:
        for i, chunk in enumerate(chunks):
            load(chunk, loaded[f"model{i}"])
    state.optimizer.load_state_dict(loaded["optimizer"])
    if state.layout.optimizer_sharding == "full":
        _fsdp_optimizer_state_as_dtensors(state.optimizer)
    sched = state.scheduler
    if hasattr(sched, "override_opt_param_scheduler"):
        sched.override_opt_param_scheduler = True  # this run's config wins; steps restored
    sched.load_state_dict(saved["scheduler"])
    state.set_position(int(saved["step"]), int(saved["consumed_samples"]))
