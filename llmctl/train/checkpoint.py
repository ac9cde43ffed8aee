"""Distributed checkpoints for the training loop: async save, atomic commit, resume, preemption.

`DistCheckpointer` implements the loop's `Checkpointer` seam (`load`, `after_step`, `close`).
Model and optimizer go through megatron-core `dist_checkpointing` (torch_dist format, sharded by
rank, resharded on load by megatron where it can); everything else a resume needs is plain JSON
written by llmctl: step, consumed samples (the data-loader position), LR scheduler, resolved
config, plan, versions, and the RNG states of every rank. The on-disk protocol (temporary
directory, per-rank durable markers, manifest with CRC32s, atomic rename, `latest` pointer,
retention) lives in `ckpt_store`.

Why async: a synchronous save stalls every rank for the whole write. megatron's async request
stages the state in host memory (a device-to-host copy on GPU; nothing on CPU, see
`_alias_views`), forks a writer, whose copy-on-write memory is the snapshot, and returns; the
loop polls it once per step (one int all-reduce) and commits when every rank is done.

Failure policy: a save that fails (disk full, permission denied, I/O error) is logged and retried
at the next step up to `checkpoint.save_retries` times; after `checkpoint.max_failed_saves`
consecutive failed saves the run stops cleanly (`TrainingStopped`, exit code 3). Earlier
checkpoints are never touched by a failed save: it only ever wrote into its `.tmp-` directory.

Preemption: SIGTERM and SIGUSR1 set a flag; at the end of the current step all ranks agree on
it (MAX all-reduce), wait for any save in flight, save synchronously unless this step is
already committed, and raise `TrainingStopped` with exit code 128 + signal number, so
schedulers see a signalled job (SLURM `--requeue`, torchrun restarts) and the next start
resumes from that checkpoint.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.config.values import enum_value as _v
from llmctl.errors import UserError
from llmctl.train import ckpt_store as store
from llmctl.train.ckpt_signals import (
    PREEMPT_SIGNALS,
    block_preempt_signals,
    die_with_parent,
    preempt_exit_code,
    start_resource_tracker,
)
from llmctl.train.ckpt_signals import preempt_signals_deferred as _preempt_signals_deferred

log = logging.getLogger("llmctl.train.checkpoint")

EXIT_SAVE_FAILED = 3
# Model fields that must match between a checkpoint and the run that loads it.
_ARCH_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "vocab_size", "normalization", "activation", "position_embedding",
    "tied_embeddings", "add_bias_linear", "num_experts",
)  # fmt: skip
_LAYOUT_DIMS = ("tp", "pp", "vpp", "cp", "ep", "dp")


class TrainingStopped(SystemExit):
    """Raised by the checkpointer to end the run cleanly (preemption, saves keep failing)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message


@dataclass
class _Pending:
    step: int
    tmp_dir: Path
    started: float
    committed: bool | None = None
    error: str | None = None


def _unwrap(module: Any) -> Any:
    while hasattr(module, "module"):
        module = module.module
    return module


def _b64(t: Any) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng() -> dict[str, Any]:
    """This rank's RNG states (python, numpy, torch CPU/CUDA, megatron's tracker) as JSON."""
    import random

    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [kind, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(gauss)],
        "torch": _b64(torch.get_rng_state()),
        "tracker": {
            k: _b64(v) for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()
        },
    }
    if torch.cuda.is_available():
        out["cuda"] = _b64(torch.cuda.get_rng_state())
    return out


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    import random

    import numpy as np
    import torch
    from megatron.core import tensor_parallel

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(_unb64(state["cuda"]))
    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.set_states({k: _unb64(v) for k, v in state["tracker"].items()})


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


def _rank_coords() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_rank(),
        "pp": ps.get_pipeline_model_parallel_rank(),
        "dp": ps.get_data_parallel_rank(),
    }


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


def sharded_state_dict(state: Any, *, is_loading: bool) -> dict[str, Any]:
    """megatron's sharded state dict of the model chunks (unwrapped from DDP) and optimizer."""
    chunks = [_unwrap(m) for m in state.model]
    sd: dict[str, Any] = {}
    if len(chunks) == 1:
        sd["model"] = chunks[0].sharded_state_dict()
    else:
        for i, chunk in enumerate(chunks):
            sd[f"model{i}"] = chunk.sharded_state_dict()
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


class DistCheckpointer:
    """Checkpoint policy of one rank; implements the loop's `Checkpointer` seam.

    Args:
        cfg: The resolved `RootConfig` (`cfg.checkpoint` holds the policy).
        run_dir: The run directory; checkpoints go to `run_dir/checkpoints`.
        plan: The plan dict recorded in each checkpoint.
    """

    def __init__(self, cfg: Any, run_dir: Path, plan: dict[str, Any] | None = None) -> None:
        self.cfg, self.policy, self.plan = cfg, cfg.checkpoint, plan or {}
        self.root = Path(run_dir) / "checkpoints"
        self.enabled = self.policy.interval > 0
        self.queue: Any = None
        self.pending: _Pending | None = None
        self.last_saved: int | None = None
        self.failed_attempts = 0
        self.failed_saves = 0
        self.retry_next = False
        self.signal: int | None = None
        self.validated_once = False
        self.blocked_s: list[float] = []  # per save: time the training loop was held
        self.commit_s: list[float] = []  # per committed save: start to commit
        self.validate_s: float | None = None  # full validation of the resume candidates
        self.load_s: float | None = None  # megatron load + state restore
        self.loaded_step: int | None = None
        self._old_handlers: dict[int, Any] = {}
        if self.enabled:
            start_resource_tracker()  # before any save: see ckpt_signals
            self._install_handlers()

    @property
    def rank(self) -> int:
        """Global rank of this process."""
        import torch.distributed as dist

        return dist.get_rank()

    @property
    def world(self) -> int:
        """Number of ranks in the job."""
        import torch.distributed as dist

        return dist.get_world_size()

    # ----- collectives (no-ops with one rank) -----
    def _all_max(self, value: int) -> int:
        if self.world == 1:
            return value
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _bcast(self, obj: Any) -> Any:
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ----- signals -----
    def _install_handlers(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in PREEMPT_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_handlers(self) -> None:
        """Give the signals back (matters when training runs inside a longer-lived process)."""
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        del frame
        if self.signal is None:
            log.warning("received %s: checkpointing after this step", signal.Signals(signum).name)
        self.signal = signum

    # ----- seam -----
    def load(self, state: Any) -> None:
        """Restore `state` from the newest complete checkpoint (skipping invalid ones)."""
        if self.enabled:
            check_optimizer_checkpointable(state.layout)
        if not self.policy.load:
            return
        steps = None
        if self.rank == 0:
            stale = store.clean_stale(self.root)
            if stale:
                log.info("removed leftovers of interrupted saves: %s", ", ".join(sorted(stale)))
            steps = store.committed_steps(self.root)
        steps = self._bcast(steps)
        found = self._newest_valid(steps)
        if found is not None:
            self.load_from(state, self.root / store.iter_name(found))
        elif steps:  # never start over silently (a requeue, a torchrun restart)
            raise UserError(
                f"no valid checkpoint in {self.root} ({len(steps)} invalid; see the rank logs); "
                "`llmctl resume RUN_DIR --restart-from-scratch` starts the run over"
            )

    def _newest_valid(self, steps: list[int]) -> int | None:
        """Newest step whose checkpoint validates; every rank checksums a share of the files."""
        t0 = time.perf_counter()
        found = None
        for step in reversed(steps):
            v = store.validate(self.root / store.iter_name(step), crc_part=(self.rank, self.world))
            if not v.ok:
                log.warning("checkpoint %s is invalid (%s); skipping it", v.path.name, v.reason)
            if not self._all_max(0 if v.ok else 1):
                found = step
                break
        self.validate_s = time.perf_counter() - t0
        return found

    def load_from(self, state: Any, ckpt_dir: Path) -> None:
        """Load one (validated) checkpoint directory into `state`."""
        from megatron.core import dist_checkpointing

        from llmctl.train.ckpt_safe import load_metadata, weights_only_loads

        t0 = time.perf_counter()
        load_metadata(ckpt_dir / ".metadata")  # rejects a .metadata naming unsafe globals
        saved = json.loads((ckpt_dir / store.TRAIN_STATE).read_text())
        changed = check_compatible(saved, self.cfg, state.layout)
        sd = sharded_state_dict(state, is_loading=True)
        try:
            with weights_only_loads():
                loaded = dist_checkpointing.load(sd, str(ckpt_dir))
        except Exception as e:
            dims = ", ".join(
                f"{d} {saved['layout'][d]}->{getattr(state.layout, d)}" for d in changed
            )
            hint = f" (layout changed: {dims}; megatron-core cannot reshard this)" if dims else ""
            raise UserError(f"cannot load checkpoint {ckpt_dir}{hint}: {e}") from e
        self._apply(state, loaded, saved, ckpt_dir, changed)
        self.load_s = time.perf_counter() - t0
        log.info(
            "resumed from %s (step %d, %d samples) in %.2f s%s", ckpt_dir.name, saved["step"],
            saved["consumed_samples"], time.perf_counter() - t0,
            f"; resharded {', '.join(changed)}" if changed else "",
        )  # fmt: skip

    def _apply(self, state: Any, loaded: dict[str, Any], saved: dict[str, Any],
               ckpt_dir: Path, changed: list[str]) -> None:  # fmt: skip
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
        if not changed and saved.get("world_size") == self.world:
            restore_rng(
                json.loads((ckpt_dir / store.RNG_DIR / f"rank_{self.rank}.json").read_text())
            )
        elif self.rank == 0:
            log.warning(
                "layout changed: RNG states start from this run's seeds, not the checkpoint's"
            )
        self.last_saved = self.loaded_step = int(saved["step"])

    def after_step(self, state: Any) -> None:
        """Finalize finished async saves, handle preemption, save when due."""
        if not self.enabled:
            return
        if self.pending is not None:
            self._finalize(blocking=False)
        signum = self._all_max(self.signal or 0)
        if signum:
            self._preempt(state, signum)
        if state.step % self.policy.interval == 0 or self.retry_next:
            self.save(state, use_async=self.policy.async_save)
        if self.failed_saves >= self.policy.max_failed_saves:
            self._stop_failed()

    def close(self, state: Any) -> None:
        """Final save (if this step is not saved yet) and wait for every write.

        Raises:
            TrainingStopped: Exit code 3 when the final save failed (even after retries).
        """
        if not self.enabled:
            return
        self.wait()
        for _ in range(1 + self.policy.save_retries):
            if self.last_saved == state.step:
                break
            self.save(state, use_async=False)
        self.wait()
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        self._restore_handlers()
        if self.last_saved != state.step:  # the run's last steps are in no checkpoint
            msg = (
                f"the final checkpoint (step {state.step}) failed; the newest complete "
                f"checkpoint is step {self.last_saved}: fix the storage and resume"
            )
            log.error(msg)
            raise TrainingStopped(EXIT_SAVE_FAILED, msg)

    # ----- saving -----
    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        if self.pending is not None:
            self._finalize(blocking=True)

    @functools.cached_property
    def _config_yaml(self) -> str:
        from llmctl.config import cfg_to_yaml

        return cfg_to_yaml(self.cfg)  # ~40 ms: once per run, not on every save's critical path

    def _header(self, state: Any) -> dict[str, Any]:
        return {
            "step": state.step,
            "consumed_samples": state.consumed_samples,
            "world_size": self.world,
            "layout": state.layout.as_dict(),
            "model": {k: _v(getattr(self.cfg.model, k, None)) for k in _ARCH_FIELDS},
            "versions": versions(),
            "backend": "torch_dist",
            "created_unix": time.time(),
        } | {"config_yaml": self._config_yaml}

    def _train_state(self, state: Any, header: dict[str, Any]) -> dict[str, Any]:
        return header | {
            "scheduler": state.scheduler.state_dict(),
            "data": [it.state_dict() for it in state.train_iters],
            "plan": self.plan,
        }

    def _prepare_dir(self, step: int) -> tuple[Path, str | None]:
        """Rank 0 creates the temp directory; every rank learns whether that worked."""
        import shutil

        tmp = self.root / f"{store.TMP_PREFIX}{store.iter_name(step)}"
        error = None
        if self.rank == 0:
            try:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir(parents=True)
                store.write_json_durable(tmp / ".probe.json", {"step": step})
                (tmp / ".probe.json").unlink()
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
        return tmp, self._bcast(error)

    def save(self, state: Any, *, use_async: bool) -> None:
        """Start (async) or perform (sync) a save of the current step. Never raises on I/O."""
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self.retry_next = False
        if self.pending is not None:
            self._finalize(blocking=True)
        t0 = time.perf_counter()
        tmp, error = self._prepare_dir(state.step)
        if error is not None:
            self._record_failure(state.step, tmp, error)
            return
        header = self._header(state)
        pending = _Pending(step=state.step, tmp_dir=tmp, started=t0)
        try:
            with _preempt_signals_deferred():
                sd = sharded_state_dict(state, is_loading=False)
                if use_async:
                    _alias_views(sd)
                req = dist_checkpointing.save(
                    sd,
                    str(tmp),
                    async_sharded_save=True,
                    validate_access_integrity=not self.validated_once,
                )
        except save_errors() as e:
            self._record_failure(state.step, tmp, describe_error(e))
            return
        self.validated_once = True
        train_state = self._train_state(state, header) if self.rank == 0 else None
        fn = _wrapped_async_fn(req.async_fn, tmp, self.rank, capture_rng(), train_state)
        req = req._replace(async_fn=fn)
        req.add_finalize_fn(lambda: self._commit(pending, header))
        self.pending = pending
        if use_async:
            if self.queue is None:
                self.queue = AsyncCallsQueue(persistent=False)
            try:
                with _preempt_signals_deferred():
                    self.queue.schedule_async_request(req)
            except save_errors() as e:  # e.g. fork() failing for lack of memory
                pending.error = describe_error(e)
                self.queue = None
                self._settle()
        else:
            try:
                with _preempt_signals_deferred():
                    req.execute_sync()
            except save_errors() as e:
                pending.error = describe_error(e)
            self._settle()
        self.blocked_s.append(time.perf_counter() - t0)

    def _commit(self, pending: _Pending, header: dict[str, Any]) -> None:
        """Finalize step on every rank: rank 0 commits, all ranks learn the outcome."""
        error = None
        if self.rank == 0:
            try:
                manifest = store.build_manifest(pending.tmp_dir, self.world, header)
                store.commit(self.root, pending.tmp_dir, pending.step, manifest)
                gone = store.apply_retention(
                    self.root, self.policy.keep_last, self.policy.keep_every, background=True
                )
                if gone:
                    log.info("retention removed checkpoints of steps %s", gone)
            except Exception as e:
                error = describe_error(e)
        error = self._bcast(error)
        pending.committed, pending.error = error is None, error

    def _finalize(self, *, blocking: bool) -> None:
        assert self.queue is not None and self.pending is not None
        try:
            done = self.queue.maybe_finalize_async_calls(blocking=blocking)
        except save_errors() as e:  # megatron raises the same CheckpointException on every rank
            done, self.pending.error = [0], describe_error(e)
        if done or blocking:
            self._settle()

    def _settle(self) -> None:
        pending, self.pending = self.pending, None
        assert pending is not None
        if pending.committed:
            self.last_saved, self.failed_attempts, self.failed_saves = pending.step, 0, 0
            self.commit_s.append(time.perf_counter() - pending.started)
            log.info(
                "checkpoint %s committed (%.2f s after start)",
                store.iter_name(pending.step), time.perf_counter() - pending.started,
            )  # fmt: skip
        else:
            self._record_failure(pending.step, pending.tmp_dir, pending.error or "unknown error")

    def _record_failure(self, step: int, tmp: Path, error: str) -> None:
        import shutil

        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        self.failed_attempts += 1
        if self.failed_attempts <= self.policy.save_retries:
            self.retry_next = True
            log.error("checkpoint at step %d failed (%s); retrying at the next step", step, error)
            return
        self.failed_attempts = 0
        self.failed_saves += 1
        log.error(
            "checkpoint at step %d failed (%s); %d consecutive failed saves (stop at %d)",
            step, error, self.failed_saves, self.policy.max_failed_saves,
        )  # fmt: skip

    def _stop_failed(self) -> None:
        msg = (
            f"stopping: {self.failed_saves} consecutive checkpoint saves failed "
            f"(checkpoint.max_failed_saves={self.policy.max_failed_saves}); the newest complete "
            f"checkpoint is step {self.last_saved}; fix the storage and resume"
        )
        log.error(msg)
        self._restore_handlers()
        raise TrainingStopped(EXIT_SAVE_FAILED, msg)

    def _preempt(self, state: Any, signum: int) -> None:
        self.wait()
        if self.last_saved != state.step:
            self.save(state, use_async=False)
        code = preempt_exit_code(signum)
        msg = (
            f"preempted by {signal.Signals(signum).name} at step {state.step}; newest checkpoint "
            f"is step {self.last_saved}; exiting with {code} so the job can be requeued"
        )
        log.warning(msg)
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        self._restore_handlers()
        raise TrainingStopped(code, msg)


def make_checkpointer(cfg: Any, run_dir: Path, plan: dict[str, Any] | None = None) -> Any:
    """The checkpointer for a run: `DistCheckpointer` unless checkpointing is off entirely."""
    from llmctl.train.loop import NullCheckpointer

    root = Path(run_dir) / "checkpoints"
    if cfg.checkpoint.interval > 0 or (cfg.checkpoint.load and store.committed_steps(root)):
        return DistCheckpointer(cfg, Path(run_dir), plan)
    return NullCheckpointer()
