"""Re-entering a run directory: `llmctl resume`, and `llmctl train` into an existing run dir.

No torch here, and nothing is written before the run is accepted. `inspect_run_dir` decides,
before any rank starts, which checkpoint the ranks will load: it validates the checkpoints
newest first exactly as the ranks do (manifest, sizes, CRC32s, the shards `.metadata` names)
and checks the run's config against the one the checkpoint was saved with (model fields,
optimizer sharding), so a mismatch is one line and exit code 2, not a failure in every rank.
When checkpoints exist but none is valid, the run is refused unless the user asks to start
over (`--restart-from-scratch`). `accept_run_dir` runs only once the launch is accepted: it
moves the invalid checkpoints into `checkpoints/invalid/` (never deleted: they are evidence).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

# Config keys a resume cannot change: where the run lives, and that it loads its checkpoint.
FIXED_ON_RESUME = ("train.run_dir", "checkpoint.load")


@dataclass(frozen=True)
class ResumePoint:
    """What the ranks of a (re)launched run will find in its checkpoints/ directory."""

    step: int | None
    """Step of the newest valid checkpoint (the one the ranks load); None = start at step 1."""
    invalid: tuple[Any, ...] = ()
    """`ckpt_store.Validation` of each newer checkpoint that failed; moved aside on launch."""

    def as_dict(self) -> dict[str, Any]:
        """JSON view for `--dry-run --json`."""
        return {
            "from_step": self.step,
            "invalid": [{"path": str(v.path), "problem": v.reason} for v in self.invalid],
        }


def prepare_resume(
    run_dir: str | Path,
    overrides: list[str],
    *,
    cluster_file: str | None = None,
    ignore_fit: bool = False,
    restart_from_scratch: bool = False,
) -> Any:
    """Check the run directory and render its relaunch (starts nothing, writes nothing).

    Args:
        run_dir: A run directory written by `llmctl train`.
        overrides: Hydra overrides applied on top of the saved config (short flags included).
        cluster_file: A cluster description replacing the saved `cluster`.
        ignore_fit: Launch even if the plan predicts the layout will not fit.
        restart_from_scratch: Start at step 1 when no checkpoint is valid.

    Returns:
        The `llmctl.launch.api.TrainLaunch`, ready for `execute_train`.

    Raises:
        UserError: Not a run directory, no (valid) checkpoint, or an override the checkpoint
            cannot take (e.g. another model shape).
    """
    from llmctl.config import load_resolved
    from llmctl.launch.api import prepare_train
    from llmctl.train.rundir import CONFIG_FILE, require_run_dir

    run_dir = require_run_dir(run_dir)
    fixed = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in FIXED_ON_RESUME]
    if fixed:
        raise UserError(f"resume cannot change {fixed[0].split('=', 1)[0]}")
    saved = load_resolved(run_dir / CONFIG_FILE)
    pinned = _pinned_sharding(run_dir, saved, overrides)
    with _saved_recipe(run_dir, drop_cluster=cluster_file is not None) as recipe:
        launch = prepare_train(
            recipe,
            [*pinned, *overrides, f"train.run_dir={run_dir}", "checkpoint.load=true"],
            cluster_file=cluster_file,
            force=ignore_fit,
            restart_from_scratch=restart_from_scratch,
        )
    point = launch.resume_point
    if point is not None and point.step is None and not point.invalid and not restart_from_scratch:
        raise UserError(
            f"{run_dir} has no checkpoint to resume from (train with checkpoint.interval > 0); "
            "pass --restart-from-scratch to start it over"
        )
    launch.cfg.recipe = saved.recipe
    return launch


@contextlib.contextmanager
def _saved_recipe(run_dir: Path, *, drop_cluster: bool) -> Iterator[str]:
    """The run's config.yaml as a recipe; without its cluster when a cluster file replaces it.

    A resolved config sets every cluster field, which would override the cluster file, so
    that case composes from a copy without the `cluster` section (in a temporary directory,
    never in the run directory).
    """
    import tempfile

    import yaml

    from llmctl.train.rundir import CONFIG_FILE

    if not drop_cluster:
        yield str(run_dir / CONFIG_FILE)
        return
    body = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    body.pop("cluster", None)
    with tempfile.TemporaryDirectory(prefix="llmctl-resume-") as tmp:
        path = Path(tmp) / CONFIG_FILE
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        yield str(path)


def _pinned_sharding(run_dir: Path, saved: Any, overrides: list[str]) -> list[str]:
    """Keep the optimizer sharding the run planned: its optimizer state cannot be converted.

    A saved config that left `parallel.optimizer_sharding` to the planner would otherwise be
    re-planned (e.g. with another `--dp`) and pick a sharding the checkpoint cannot load.
    """
    from llmctl.train.rundir import read_plan

    key = "parallel.optimizer_sharding"
    if saved.parallel.optimizer_sharding is not None or any(
        o.lstrip("+~").startswith(f"{key}=") for o in overrides
    ):
        return []
    planned = (read_plan(run_dir).get("layout") or {}).get("optimizer_sharding")
    return [f"{key}={planned}"] if planned else []


def inspect_run_dir(cfg: Any, layout: Any, *, restart_from_scratch: bool) -> ResumePoint | None:
    """Decide what a launch into `cfg.train.run_dir` will load; None for a new run directory.

    Raises:
        UserError: The directory exists but is not a run directory; checkpoints exist but none
            is valid (unless `restart_from_scratch`); `checkpoint.load=false` would overwrite
            checkpoints; the newest valid checkpoint does not match this config.
    """
    from llmctl.train import ckpt_store as store
    from llmctl.train.rundir import CHECKPOINTS_DIR, CONFIG_FILE

    run_dir = Path(cfg.train.run_dir)
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    if not (run_dir / CONFIG_FILE).is_file():
        raise UserError(
            f"train.run_dir={run_dir} exists and is not a run directory (no {CONFIG_FILE}); "
            "choose a new or empty directory"
        )
    root = run_dir / CHECKPOINTS_DIR
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
    return ResumePoint(step=None if valid is None else valid.step, invalid=tuple(invalid))


def check_checkpoint_matches(ckpt_dir: Path, cfg: Any, layout: Any) -> None:
    """The ranks' compatibility check (model fields, optimizer sharding), run in the launcher.

    Raises:
        UserError: One line naming the field, the saved value and this run's value.
    """
    from llmctl.train import ckpt_store as store
    from llmctl.train.checkpoint import check_compatible

    saved = json.loads((ckpt_dir / store.TRAIN_STATE).read_text())
    check_compatible(saved, cfg, layout)


def accept_run_dir(point: ResumePoint | None) -> list[Path]:
    """Move the invalid checkpoints of an accepted launch aside. Returns their new paths."""
    from llmctl.train import ckpt_store as store

    if point is None:
        return []
    return [store.move_aside(v.path, v.reason) for v in point.invalid]
