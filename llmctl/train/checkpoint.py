"""Distributed checkpoints for the training loop: async save, atomic commit, resume, preemption.

`DistCheckpointer` implements the loop's `Checkpointer` seam (`load`, `after_step`, `close`).
Model and optimizer go through megatron-core `dist_checkpointing` (torch_dist format, sharded by
rank, resharded on load by megatron where it can); everything else a resume needs is plain JSON
written by llmctl: step, consumed samples (the data-loader position), LR scheduler, resolved
config, plan, versions, and the RNG states of every rank. The on-disk protocol (temporary
directory, per-rank durable markers, manifest with CRC32s, atomic rename, `latest` pointer,
retention) lives in `ckpt_store`; selecting and loading a checkpoint in `ckpt_load`; the pieces
of a save in `ckpt_save`; RNG states in `ckpt_rng`; preemption signals, and helper processes
that survive them but not their rank, in `ckpt_signals`. This module holds the policy.

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

import functools
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.config.values import enum_value as _v
from llmctl.errors import UserError
from llmctl.run import ckpt_store as store
from llmctl.run.ckpt_compat import (
    ARCH_FIELDS,
    check_compatible,
    check_optimizer_checkpointable,
    uses_torch_adam,
)
from llmctl.run.layout import layout_record
from llmctl.run.signals import (
    PREEMPT_SIGNALS,
    PreemptNotice,
    preempt_exit_code,
    start_resource_tracker,
)
from llmctl.run.signals import preempt_signals_deferred as _preempt_signals_deferred
from llmctl.train.ckpt_load import load_checkpoint, newest_valid_step
from llmctl.train.ckpt_rng import capture_rng, restore_rng
from llmctl.train.ckpt_save import (  # noqa: F401 - re-exported
    _alias_views,
    _Pending,
    _unwrap,
    _wrapped_async_fn,
    check_fsdp_shards_even,
    describe_error,
    save_errors,
    sharded_state_dict,
    versions,
)
from llmctl.train.lora import base_record

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan import PlanRecord

log = logging.getLogger("llmctl.train.checkpoint")
__all__ = [
    "EXIT_SAVE_FAILED",
    "PREEMPT_SIGNALS",
    "DistCheckpointer",
    "TrainingStopped",
    "capture_rng",
    "check_compatible",
    "check_optimizer_checkpointable",
    "make_checkpointer",
    "preempt_exit_code",
    "restore_rng",
    "sharded_state_dict",
    "uses_torch_adam",
    "versions",
]

EXIT_SAVE_FAILED = 3


class TrainingStopped(SystemExit):
    """Raised by the checkpointer to end the run cleanly (preemption, saves keep failing)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message


class DistCheckpointer:
    """Checkpoint policy of one rank; implements the loop's `Checkpointer` seam.

    Args:
        cfg: The resolved `RootConfig` (`cfg.checkpoint` holds the policy).
        run_dir: The run directory; checkpoints go to `run_dir/checkpoints`.
        plan: The run's plan, recorded in each checkpoint.
    """

    def __init__(self, cfg: RootConfig, run_dir: Path, plan: PlanRecord | None = None) -> None:
        self.cfg, self.policy, self.plan = cfg, cfg.checkpoint, plan
        self.root = Path(run_dir) / "checkpoints"
        self.enabled = self.policy.interval > 0
        self.queue: Any = None
        self.pending: _Pending | None = None
        self.last_saved: int | None = None
        self.failed_attempts = 0
        self.failed_saves = 0
        self.retry_next = False
        self.notice = PreemptNotice()
        self.validated_once = False
        self.blocked_s: list[float] = []  # per save: time the training loop was held
        self.commit_s: list[float] = []  # per committed save: start to commit
        self.validate_s: float | None = None  # full validation of the resume candidates
        self.load_s: float | None = None  # megatron load + state restore
        self.loaded_step: int | None = None
        self.store_url = self.policy.dir  # s3://...: local save, then a background upload
        self.uploader: Any = None  # rank 0's ckpt_upload.Uploader
        self.local_saved: int | None = None  # newest local commit (the store may lag behind)
        self.started: dict[int, float] = {}  # step -> start of its save
        self.fetch_s: float | None = None  # replacement node: fetching from the store
        if self.enabled:
            start_resource_tracker()  # before any save: see ckpt_signals
            self.notice.install()

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

    # ----- seam -----
    def load(self, state: Any) -> None:
        """Restore `state` from the newest complete checkpoint (skipping invalid ones)."""
        if self.enabled:
            check_optimizer_checkpointable(state.layout)
            if state.layout.optimizer_sharding == "full":
                check_fsdp_shards_even(state.model)
        if not self.policy.load:
            return
        if self.store_url and self._load_from_store(state):
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

    def _upload(self) -> Any:
        """Rank 0's uploader (created on first use: it writes `uploads.json`)."""
        if self.uploader is None:
            from llmctl.run.ckpt_upload import Uploader

            self.uploader = Uploader(
                str(self.store_url), self.root.parent,
                timeout_s=self.policy.upload_timeout_s, keep_local=self.policy.keep_local,
                keep_last=self.policy.keep_last, keep_every=self.policy.keep_every,
            )  # fmt: skip
        return self.uploader

    def _load_from_store(self, state: Any) -> bool:
        """Load the store's newest valid checkpoint (its local copy or a download).

        Returns False when the store holds no committed checkpoint (the local ones, if any,
        are then selected as without a store).

        Raises:
            UserError: The store cannot be read, or none of its checkpoints is valid.
        """
        from llmctl.run.ckpt_upload import fetch_newest

        t0 = time.perf_counter()
        found: tuple[int | None, str | None, int] = (None, None, 0)
        if self.rank == 0:
            self._upload()
            try:
                got, skipped, count = fetch_newest(
                    str(self.store_url), self.root, timeout_s=self.policy.upload_timeout_s
                )
                for line in skipped:
                    log.warning("checkpoint %s is invalid; skipping it", line)
                if got is not None:
                    log.info(
                        "checkpoint %s of %s: %s (%d bytes, %.2f s)", got.local.name,
                        self.store_url, got.source, got.bytes, got.seconds,
                    )  # fmt: skip
                found = (None if got is None else got.step, None, count)
            except Exception as e:  # every rank must learn it (they wait in the broadcast)
                found = (None, f"cannot read checkpoints from {self.store_url}: {e}", 0)
        step, error, count = self._bcast(found)
        self.fetch_s = time.perf_counter() - t0
        if error is not None:
            raise UserError(error)
        if step is None and count:
            raise UserError(
                f"no valid checkpoint in {self.store_url} ({count} invalid; see the rank logs); "
                "`llmctl resume RUN_DIR --restart-from-scratch` starts the run over"
            )
        if step is None:
            return False
        self.load_from(state, self.root / store.iter_name(step))
        self.local_saved = step
        return True

    def _upload_state(self, *, block: bool) -> bool:
        """Apply a finished upload's outcome on every rank (rank 0's uploader, broadcast).

        Returns whether an upload is still in flight.
        """
        info: tuple[bool, tuple[int, str | None] | None] | None = None
        if self.rank == 0 and self.uploader is not None:
            if block:
                self.uploader.join()
            done = self.uploader.take()
            busy = self.uploader.in_flight()
            info = (busy, None if done is None else (done.step, done.error))
        info = self._bcast(info)
        if info is None:
            return False
        busy, done = info
        if done is not None:
            step, error = done
            if error is None:
                self.last_saved, self.failed_attempts, self.failed_saves = step, 0, 0
                started = self.started.pop(step, None)
                if started is not None:
                    self.commit_s.append(time.perf_counter() - started)
                log.info(
                    "checkpoint %s committed in %s (%.2f s after start)", store.iter_name(step),
                    self.store_url, time.perf_counter() - (started or time.perf_counter()),
                )  # fmt: skip
            else:
                self._record_failure(step, None, error)
        return busy

    def _newest_valid(self, steps: list[int]) -> int | None:
        """Newest step whose checkpoint validates; every rank checksums a share of the files."""
        t0 = time.perf_counter()
        found = newest_valid_step(self.root, steps, self.rank, self.world, self._all_max)
        self.validate_s = time.perf_counter() - t0
        return found

    def load_from(self, state: Any, ckpt_dir: Path) -> None:
        """Load one (validated) checkpoint directory into `state`."""
        t0 = time.perf_counter()
        step = load_checkpoint(state, ckpt_dir, self.cfg, self.rank, self.world)
        self.load_s = time.perf_counter() - t0
        self.last_saved = self.loaded_step = step

    def after_step(self, state: Any) -> None:
        """Finalize finished async saves, handle preemption, save when due."""
        if not self.enabled:
            return
        if self.pending is not None:
            self._finalize(blocking=False)
        if self.store_url:
            self._upload_state(block=False)
        signum = self._all_max(self.notice.signum or 0)
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
            self.wait()  # with an object store: the upload too
        self.wait()
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        self.notice.restore()
        if self.last_saved != state.step:  # the run's last steps are in no checkpoint
            msg = (
                f"the final checkpoint (step {state.step}) failed; {self._newest_text()}: "
                "fix the storage and resume"
            )
            log.error(msg)
            raise TrainingStopped(EXIT_SAVE_FAILED, msg)

    # ----- saving -----
    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        if self.pending is not None:
            self._finalize(blocking=True)
        if self.store_url:
            self._upload_state(block=True)

    @functools.cached_property
    def _config_yaml(self) -> str:
        from llmctl.config import cfg_to_yaml

        return cfg_to_yaml(self.cfg)  # ~40 ms: once per run, not on every save's critical path

    def _header(self, state: Any) -> dict[str, Any]:
        return (
            {
                "step": state.step,
                "consumed_samples": state.consumed_samples,
                "world_size": self.world,
                "layout": layout_record(state.layout, self.cfg.train.global_batch_size),
                "model": {k: _v(getattr(self.cfg.model, k, None)) for k in ARCH_FIELDS},
                "versions": versions(),
                "backend": "torch_dist",
                "created_unix": time.time(),
            }
            | {"config_yaml": self._config_yaml}
            | base_record(state.model)
        )  # LoRA: its base

    def _train_state(self, state: Any, header: dict[str, Any]) -> dict[str, Any]:
        return header | {
            "scheduler": state.scheduler.state_dict(),
            "data": [it.state_dict() for it in state.train_iters],
            "plan": self.plan.as_dict() if self.plan is not None else {},
        }

    def _prepare_dir(self, step: int) -> tuple[Path, str | None]:
        """Rank 0 creates the temp directory; every rank learns whether that worked."""
        import shutil

        tmp = store.staging_dir(self.root, step)
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
        if self.store_url and not self._upload_gate(state.step):
            return
        if self.store_url and self.local_saved == state.step and self.last_saved != state.step:
            self.started[state.step] = t0  # committed locally, its upload failed: upload again
            if self.rank == 0:
                self._upload().start(state.step)
            return
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

    def _upload_gate(self, step: int) -> bool:
        """With the previous upload still in flight: wait for it, or skip this save."""
        if not self._upload_state(block=False):
            return True
        if _v(self.policy.upload_in_flight) == "skip":
            log.warning(
                "checkpoint at step %d skipped: the previous upload is still in flight "
                "(checkpoint.upload_in_flight=skip)", step,
            )  # fmt: skip
            return False
        self._upload_state(block=True)
        return True

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
        if pending.committed and self.store_url:  # the local snapshot: now upload it
            self.local_saved = pending.step
            self.started[pending.step] = pending.started
            if self.rank == 0:
                self._upload().start(pending.step)
            log.info(
                "checkpoint %s committed locally (%.2f s after start); uploading to %s",
                store.iter_name(pending.step), time.perf_counter() - pending.started,
                self.store_url,
            )  # fmt: skip
        elif pending.committed:
            self.last_saved, self.failed_attempts, self.failed_saves = pending.step, 0, 0
            self.commit_s.append(time.perf_counter() - pending.started)
            log.info(
                "checkpoint %s committed (%.2f s after start)",
                store.iter_name(pending.step), time.perf_counter() - pending.started,
            )  # fmt: skip
        else:
            self._record_failure(pending.step, pending.tmp_dir, pending.error or "unknown error")

    def _record_failure(self, step: int, tmp: Path | None, error: str) -> None:
        import shutil

        if self.rank == 0 and tmp is not None:
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

    def _newest_text(self) -> str:
        if self.last_saved is None:
            return "there is no complete checkpoint"
        return f"the newest complete checkpoint is step {self.last_saved}"

    def _stop_failed(self) -> None:
        msg = (
            f"stopping: {self.failed_saves} consecutive checkpoint saves failed "
            f"(checkpoint.max_failed_saves={self.policy.max_failed_saves}); "
            f"{self._newest_text()}; fix the storage and resume"
        )
        log.error(msg)
        self.notice.restore()
        raise TrainingStopped(EXIT_SAVE_FAILED, msg)

    def _preempt(self, state: Any, signum: int) -> None:
        self.wait()
        if self.last_saved != state.step:
            self.save(state, use_async=False)
            self.wait()  # with an object store: the upload too
        code = preempt_exit_code(signum)
        msg = (
            f"preempted by {signal.Signals(signum).name} at step {state.step}; newest checkpoint "
            f"is step {self.last_saved}; exiting with {code} so the job can be requeued"
        )
        log.warning(msg)
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        self.notice.restore()
        raise TrainingStopped(code, msg)


def make_checkpointer(cfg: RootConfig, run_dir: Path, plan: PlanRecord | None = None) -> Any:
    """The checkpointer for a run: `DistCheckpointer` unless checkpointing is off entirely."""
    from llmctl.train.loop import NullCheckpointer

    root = Path(run_dir) / "checkpoints"
    stored = cfg.checkpoint.load and bool(cfg.checkpoint.dir)  # the store is read by load()
    if (
        cfg.checkpoint.interval > 0
        or stored
        or (cfg.checkpoint.load and store.committed_steps(root))
    ):
        return DistCheckpointer(cfg, Path(run_dir), plan)
    return NullCheckpointer()
