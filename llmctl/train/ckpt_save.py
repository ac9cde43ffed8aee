"""Pieces of a checkpoint save: megatron's sharded state, zero-copy views, per-rank files.

`DistCheckpointer.save` (checkpoint.py) drives a save; this module holds what it is made of:
the sharded state dict of the model chunks and optimizer, the re-wrapping of CPU views that
spares megatron's async save a clone (`_alias_views`), the function a (forked) writer runs
(megatron's write, then llmctl's per-rank JSON files and durable completion marker), and the
one-line description of a failed save.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError
from llmctl.run import ckpt_store as store
from llmctl.run.signals import block_preempt_signals, die_with_parent

log = logging.getLogger("llmctl.train.checkpoint")


@dataclass
class _Pending:
    """A save in flight: its step, temporary directory and outcome."""

    step: int
    tmp_dir: Path
    started: float
    committed: bool | None = None
    error: str | None = None


def _unwrap(module: Any) -> Any:
    while hasattr(module, "module"):
        module = module.module
    return module


def versions() -> dict[str, str]:
    """llmctl, megatron-core and torch versions (recorded in every checkpoint)."""
    import megatron.core
    import torch

    import llmctl

    return {
        "llmctl": llmctl.__version__,
        "megatron_core": str(getattr(megatron.core, "__version__", "unknown")),
        "torch": torch.__version__,
    }


def check_fsdp_shards_even(model: list[Any]) -> None:
    """Refuse FSDP checkpoints of parameters whose first dimension DP does not divide.

    Why: megatron-core describes each FSDP2 shard as an equal fragment of axis 0; FSDP2 gives
    the last rank a shorter shard when DP does not divide it, and the save fails ("global
    shape" assertion, measured on the demo model at DP=3: a vocabulary of 4,096 rows is 1,366,
    1,366 and 1,364), after which the ranks no longer agree on the next collective.

    Raises:
        UserError: Naming the first such parameter, its rows and DP.
    """
    from torch.distributed.tensor import DTensor

    for chunk in model:
        for name, param in _unwrap(chunk).named_parameters():
            if isinstance(param, DTensor):
                dp = param.device_mesh.size()
                rows = int(param.shape[0]) if param.dim() else 1
                if rows % dp:
                    raise UserError(
                        f"checkpoint: FSDP cannot checkpoint {name} ({rows} rows) over DP={dp} "
                        "(megatron-core needs equal shards); pick a DP that divides it or set "
                        "checkpoint.interval=0"
                    )


@contextlib.contextmanager
def _fsdp_param_identity() -> Iterator[None]:
    """Let megatron match optimizer state to FSDP2 (DTensor) parameters.

    megatron-core builds a model's sharded tensors on a DTensor's `_local_tensor` and maps
    optimizer parameters to them by `id(to_local_if_dtensor(param))`; torch 2.13's
    `DTensor.to_local()` returns a new tensor object on every call, even without grad, so no
    parameter matched ("Param id 0 does not match any model sharded param"). While the state
    dict is built, the lookup returns `_local_tensor` itself.
    """
    from megatron.core.dist_checkpointing import optimizer as dist_optim

    original = dist_optim.to_local_if_dtensor

    def local_tensor(tensor: Any) -> Any:
        return getattr(tensor, "_local_tensor", tensor)

    dist_optim.to_local_if_dtensor = local_tensor
    try:
        yield
    finally:
        dist_optim.to_local_if_dtensor = original


def swiglu_fsdp_pieces(
    rows: int, dp_rank: int, dp: int, tp_rank: int, tp: int
) -> list[tuple[int, int, int, int]]:
    """Where an FSDP shard of SwiGLU's fused fc1 lies in the checkpoint's [gate; up] matrix.

    A TP rank's fc1 holds its gate rows then its up rows (`F` each); FSDP gives DP rank j rows
    [j*rows, (j+1)*rows) of those `2F`. The checkpoint's global tensor is every TP rank's gate,
    then every TP rank's up (the layout without FSDP). The shard is cut into equal pieces (of
    gcd(rows, F) rows, so that no piece straddles gate and up and all ranks' pieces form one
    grid); returns (local start, length, fragment index, fragments) for each.
    """
    half = rows * dp // 2
    size = math.gcd(rows, half)
    fragments = 2 * tp * half // size
    pieces = []
    for start in range(0, rows, size):
        q = dp_rank * rows + start  # row within this TP rank's [gate; up]
        row = tp_rank * half + q if q < half else tp * half + tp_rank * half + (q - half)
        pieces.append((start, size, row // size, fragments))
    return pieces


@contextlib.contextmanager
def _fsdp_swiglu_rows(dp: int) -> Iterator[None]:
    """Checkpoint SwiGLU's fused fc1 under FSDP as rows of the whole [gate; up] matrix.

    megatron-core's `apply_swiglu_sharded_factory` takes the first and second halves of each
    rank's local tensor as its gate and up parts. Under FSDP the local tensor is a DP slice of
    the TP rank's [gate; up] (at DP=2, rank 0 holds the whole gate), so the checkpoint was only
    readable at the layout that wrote it (a DP change resumed with losses 8e-3 off). While the
    state dict is built, the factory places each shard by `swiglu_fsdp_pieces` instead; the
    optimizer's moments go through the same factory. DP=1 is megatron's own case.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    from megatron.core.transformer import mlp

    original = mlp.apply_swiglu_sharded_factory

    def factory(sh_ten: Any, sharded_offsets: Any, singleton_local_shards: bool = False) -> Any:
        if dp == 1 or singleton_local_shards:
            return original(sh_ten, sharded_offsets, singleton_local_shards)
        axis = len(sharded_offsets)
        rows = sh_ten.local_shape[0]
        rank = sh_ten.global_offset[axis] // rows  # megatron's tp_rank * dp + dp_rank
        tp = sh_ten.axis_fragmentations[axis] // dp
        pieces = swiglu_fsdp_pieces(rows, rank % dp, dp, rank // dp, tp)

        def build(key: str, t: Any, replica_id: Any, flattened_range: Any) -> list[Any]:
            out = []
            for start, size, index, count in pieces:
                offset = (axis, index, count)
                sh = ShardedTensor.from_rank_offsets
                piece = sh(key, t[start : start + size], *sharded_offsets, offset,
                           replica_id=replica_id, prepend_axis_num=axis)  # fmt: skip
                out.append(piece)
            return out

        def merge(parts: list[Any]) -> Any:
            import torch

            return torch.cat(parts)

        return ShardedTensorFactory(
            sh_ten.key, sh_ten.data, build, merge, sh_ten.replica_id,
            flattened_range=sh_ten.flattened_range,
        )  # fmt: skip

    mlp.apply_swiglu_sharded_factory = factory
    try:
        yield
    finally:
        mlp.apply_swiglu_sharded_factory = original


def _dp_cp_size() -> int:
    """The DP x CP group FSDP shards over (the group megatron's sharded tensors name)."""
    from megatron.core import parallel_state

    return int(parallel_state.get_data_parallel_world_size(with_context_parallel=True))


def sharded_state_dict(state: Any, *, is_loading: bool) -> dict[str, Any]:
    """megatron's sharded state dict of the model chunks (unwrapped from DDP) and optimizer."""
    import torch

    from llmctl.train.lora import checkpoint_view  # LoRA: the adapters only

    fsdp = state.layout.optimizer_sharding == "full"
    rows = _fsdp_swiglu_rows(_dp_cp_size()) if fsdp else contextlib.nullcontext()
    with torch.no_grad(), _fsdp_param_identity(), rows:
        chunks = [_unwrap(m) for m in state.model]
        sd: dict[str, Any] = {}
        if len(chunks) == 1:
            sd["model"] = checkpoint_view(chunks[0], chunks[0].sharded_state_dict())
        else:
            for i, chunk in enumerate(chunks):
                sd[f"model{i}"] = checkpoint_view(chunk, chunk.sharded_state_dict())
        sd["optimizer"] = state.optimizer.sharded_state_dict(sd, is_loading=is_loading)
    return sd


def _alias_views(sd: dict[str, Any]) -> int:
    """Build megatron's tensor factories now and re-wrap CPU views without copying them.

    Why: megatron's async save clones every CPU tensor whose storage is larger than the tensor
    (SwiGLU's fused `linear_fc1` weight and its Adam moments are checkpointed as two halves,
    i.e. views) so that a half is written without the rest of its storage. That clone runs in
    the training loop: ~70 ms and 0.4 GB for a 1.1 GiB state. It is not what makes the write a
    snapshot (megatron hands every other CPU tensor to the writer as is; the forked writer's
    copy-on-write memory is the snapshot), so a tensor over the same memory whose storage is
    exactly its own bytes (via numpy, zero-copy) writes the same bytes without the clone.
    Contiguous CPU tensors of numpy dtypes only; anything else is left to megatron. Returns the
    number of tensors re-wrapped.
    """
    try:
        from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories
    except ImportError:  # pragma: no cover - a megatron-core without these public names
        return 0
    import torch

    apply_factories(sd)
    count = 0

    def visit(x: Any) -> None:
        nonlocal count
        if isinstance(x, dict):
            for v in x.values():
                visit(v)
        elif isinstance(x, list):
            for v in x:
                visit(v)
        elif isinstance(x, ShardedTensor) and isinstance(x.data, torch.Tensor):
            t = x.data.detach()
            if (
                t.device.type == "cpu"
                and t.is_contiguous()
                and t.numel() > 0
                and t.untyped_storage().size() != t.numel() * t.element_size()
            ):
                try:
                    x.data = torch.from_numpy(t.numpy())
                    count += 1
                except (TypeError, RuntimeError):  # e.g. bfloat16: numpy has no such dtype
                    pass

    visit(sd)
    return count


def _write_rank_files(ckpt_dir: Path, rank: int, rng: dict[str, Any], train_state: Any) -> None:
    """Write this rank's JSON files, fsync them and its shards, then its completion marker."""
    store.write_json_durable(ckpt_dir / store.RNG_DIR / f"rank_{rank}.json", rng)
    if train_state is not None:
        store.write_json_durable(ckpt_dir / store.TRAIN_STATE, train_state)
    store.write_rank_marker(ckpt_dir, rank, store.rank_files(ckpt_dir, rank))


def _wrapped_async_fn(
    fn: Any, ckpt_dir: Path, rank: int, rng: dict[str, Any], train_state: Any
) -> Any:
    """megatron's write function followed by llmctl's per-rank files and marker."""
    trainer_pid = os.getpid()

    def run(*args: Any, **kwargs: Any) -> None:
        if os.getpid() != trainer_pid:  # a forked writer finishes its write, unless the rank dies
            block_preempt_signals()
            die_with_parent(signal.SIGKILL, trainer_pid)
            # megatron's writer forks its own workers: they end with the writer, too
            os.register_at_fork(after_in_child=lambda: die_with_parent(signal.SIGKILL))
        if fn is not None:
            fn(*args, **kwargs)
        try:
            _write_rank_files(ckpt_dir, rank, rng, train_state)
        except OSError as e:  # no marker: the commit fails and the failed-save policy decides
            log.error("rank %d: cannot write its checkpoint files (%s)", rank, describe_error(e))

    return run


def save_errors() -> tuple[type[BaseException], ...]:
    """What a failed save raises: any Exception, and torch's CheckpointException, which is a
    BaseException (megatron re-raises a writer's OSError as one)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def describe_error(e: BaseException) -> str:
    """One line: the type and the last line of the message (CheckpointException carries whole
    tracebacks of the failed ranks; their last line names the cause, e.g. ENOSPC)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"
