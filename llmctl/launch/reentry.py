"""Re-entering a run directory: what a launch into an existing run dir will load, checked first.

No torch here, and nothing is written before the launch is accepted. `inspect_run_dir` decides,
before any rank starts, which checkpoint the ranks will load: it validates the checkpoints
newest first exactly as the ranks do (manifest, sizes, CRC32s, the shards `.metadata` names)
and checks the run's config against the one the checkpoint was saved with (model fields,
optimizer sharding), so a mismatch is one line and exit code 2, not a failure in every rank.
When checkpoints exist but none is valid, the launch is refused unless the user asks to start
over (`--restart-from-scratch`). `accept_run_dir` runs only once the launch is accepted: it
moves the invalid checkpoints into `checkpoints/invalid/` (never deleted: they are evidence).
Used by `launch.api.prepare_train`/`execute_train`, so `train` and `resume` share it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan import Layout
    from llmctl.run.ckpt_store import Validation


@dataclass(frozen=True)
class ResumePoint:
    """What the ranks of a (re)launched run will find in its checkpoints/ directory."""

    step: int | None
    """Step of the newest valid checkpoint (the one the ranks load); None = start at step 1."""
    invalid: tuple[Validation, ...] = ()
    """`ckpt_store.Validation` of each newer checkpoint that failed; moved aside on launch."""

    def as_dict(self) -> dict[str, Any]:
        """JSON view for `--dry-run --json`."""
        return {
            "from_step": self.step,
            "invalid": [{"path": str(v.path), "problem": v.reason} for v in self.invalid],
        }


def inspect_run_dir(
    cfg: RootConfig, layout: Layout, *, restart_from_scratch: bool
) -> ResumePoint | None:
    """Decide what a launch into `cfg.train.run_dir` will load; None for a new run directory.

    Raises:
        UserError: The directory exists but is not a run directory; checkpoints exist but none
            is valid (unless `restart_from_scratch`); `checkpoint.load=false` would overwrite
            checkpoints; the newest valid checkpoint does not match this config or is past
            `train.train_iters` (nothing left to train).
    """
    from llmctl.run import ckpt_store as store
    from llmctl.run.rundir import CHECKPOINTS_DIR, CONFIG_FILE

    run_dir = Path(str(cfg.train.run_dir))
    _check_run_dir_place(run_dir)
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    if not (run_dir / CONFIG_FILE).is_file():
        raise UserError(
            f"train.run_dir={run_dir} exists and is not a run directory (no {CONFIG_FILE}); "
            "choose a new or empty directory"
        )
    root = run_dir / CHECKPOINTS_DIR
    if cfg.checkpoint.dir is not None and cfg.checkpoint.load:  # the ranks select in the store
        from llmctl.run.ckpt_compat import check_compatible
        from llmctl.run.ckpt_upload import store_resume_step

        step, saved = store_resume_step(str(cfg.checkpoint.dir))
        if saved is not None:
            check_compatible(saved, cfg, layout)
        return ResumePoint(step=step)
    if not cfg.checkpoint.load:
        if store.committed_steps(root):
            raise UserError(
                f"checkpoint.load=false would overwrite the checkpoints in {root}; "
                "choose a new train.run_dir"
            )
        return ResumePoint(step=None)
    valid, invalid = store.newest_valid(root, full=True)
    if valid is None and invalid and not restart_from_scratch:
        each = "; ".join(f"{v.path.name}: {v.reason}" for v in invalid)
        raise UserError(
            f"{run_dir} has no valid checkpoint ({each}); pass --restart-from-scratch to start "
            f"over at step 1 (the invalid ones are then moved to {root / store.INVALID_DIR})"
        )
    if valid is not None:
        check_checkpoint_matches(valid.path, cfg, layout)
        if valid.step is not None:
            _check_steps_left(run_dir, valid.step, int(cfg.train.train_iters))
    return ResumePoint(step=None if valid is None else valid.step, invalid=tuple(invalid))


def _check_steps_left(run_dir: Path, step: int, train_iters: int) -> None:
    """A checkpoint past `train_iters` leaves nothing to train: say so, rather than start ranks
    that stop at once and leave a run reading "step 60/50".

    Raises:
        UserError: naming the checkpoint's step and `train.train_iters`.
    """
    if step > train_iters:
        raise UserError(
            f"{run_dir}: its newest checkpoint is at step {step}, already past "
            f"train.train_iters={train_iters}: nothing to train; raise train.train_iters above "
            f"{step} to continue, or choose a new train.run_dir"
        )


def _check_run_dir_place(run_dir: Path) -> None:
    """A run directory can be made (or is a folder): not a file, not under a file, writable.

    Raises:
        UserError: naming `train.run_dir` and what is in the way.
    """
    from llmctl.staging import check_writable_parent

    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(
            f"train.run_dir={run_dir} is a file, not a directory; choose a new or empty directory"
        )
    try:
        check_writable_parent(run_dir / CHECK_CHILD)
    except UserError as exc:
        raise UserError(f"train.run_dir={run_dir}: {exc.message}") from None


CHECK_CHILD = "config.yaml"
"""A file every run directory holds: its parent (the run directory) must be writable."""


def check_checkpoint_matches(ckpt_dir: Path, cfg: RootConfig, layout: Layout) -> None:
    """The ranks' compatibility check (model fields, optimizer sharding), run in the launcher.

    Raises:
        UserError: One line naming the field, the saved value and this run's value.
    """
    from llmctl.run import ckpt_store as store
    from llmctl.run.ckpt_compat import check_compatible

    saved = json.loads((ckpt_dir / store.TRAIN_STATE).read_text())
    if saved.get("weights_only"):  # written by `llmctl import hf`: no optimizer state to resume
        raise UserError(f"{ckpt_dir} holds weights only (llmctl import hf); start a run from it "
                        f"with checkpoint.init_from={ckpt_dir.parent.parent}")  # fmt: skip
    check_compatible(saved, cfg, layout)


def accept_run_dir(point: ResumePoint | None) -> list[Path]:
    """Move the invalid checkpoints of an accepted launch aside. Returns their new paths."""
    from llmctl.run import ckpt_store as store

    if point is None:
        return []
    return [store.move_aside(v.path, v.reason) for v in point.invalid]
