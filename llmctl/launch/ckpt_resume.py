"""`llmctl resume RUN_DIR [key=value ...]`: relaunch a run from its newest valid checkpoint.

No torch here: the run's saved config (RUN_DIR/config.yaml) is recomposed with the overrides
(more steps, a new layout, another launcher or cluster file) through the same launch path as
`llmctl train` (`launch.api.prepare_train`), whose run-directory checks (`launch.reentry`)
validate the checkpoints and the overrides against the one that will load before anything
starts; the training processes then load it themselves (`checkpoint.load`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.launch.backend import TrainLaunch

# Config keys a resume cannot change: where the run lives, and that it loads its checkpoint.
FIXED_ON_RESUME = ("train.run_dir", "checkpoint.load", "recipe")


def prepare_resume(
    run_dir: str | Path,
    overrides: list[str],
    *,
    cluster_file: str | None = None,
    ignore_fit: bool = False,
    restart_from_scratch: bool = False,
) -> TrainLaunch:
    """Check the run directory and render its relaunch (starts nothing, writes nothing).

    Args:
        run_dir: A run directory written by `llmctl train`.
        overrides: Hydra overrides applied on top of the saved config (short flags included).
        cluster_file: A cluster description replacing the saved `cluster`.
        ignore_fit: Launch even if the plan predicts the layout will not fit.
        restart_from_scratch: Start at step 1 when no checkpoint is valid.

    Returns:
        The launch, ready for `execute_train`; its config keeps the run's recipe name.

    Raises:
        UserError: Not a run directory, no (valid) checkpoint, or an override the checkpoint
            cannot take (e.g. another model shape).
    """
    from llmctl.config import load_resolved
    from llmctl.launch.api import prepare_train
    from llmctl.run.rundir import CONFIG_FILE, require_run_dir

    run_dir = require_run_dir(run_dir)
    fixed = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in FIXED_ON_RESUME]
    if fixed:
        raise UserError(f"resume cannot change {fixed[0].split('=', 1)[0]}")
    saved = load_resolved(run_dir / CONFIG_FILE)
    pinned = _pinned_sharding(run_dir, saved, overrides)
    drop = _replaced_groups(overrides) | ({"cluster"} if cluster_file is not None else set())
    with _saved_recipe(run_dir, drop=drop) as recipe:
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
    return replace(launch, cfg=replace(launch.cfg, recipe=saved.recipe))


def _replaced_groups(overrides: list[str]) -> set[str]:
    """Config groups that an override selects as a whole (`launcher=slurm`, `precision=bf16`)."""
    from llmctl.config import GROUPS

    return {o.split("=", 1)[0] for o in overrides if o.split("=", 1)[0] in GROUPS}


@contextlib.contextmanager
def _saved_recipe(run_dir: Path, *, drop: set[str]) -> Iterator[str]:
    """The run's config.yaml as a recipe, without the sections in `drop`.

    A resolved config sets every field of every section, which would override a cluster file
    or a group option chosen on the command line (`launcher=slurm`), so those cases compose
    from a copy without those sections (in a temporary directory, never in the run directory).
    """
    import tempfile

    import yaml

    from llmctl.run.rundir import CONFIG_FILE

    if not drop:
        yield str(run_dir / CONFIG_FILE)
        return
    body = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    for section in drop:
        body.pop(section, None)
    with tempfile.TemporaryDirectory(prefix="llmctl-resume-") as tmp:
        path = Path(tmp) / CONFIG_FILE
        path.write_text(yaml.safe_dump(body, sort_keys=False))
        yield str(path)


def _pinned_sharding(run_dir: Path, saved: RootConfig, overrides: list[str]) -> list[str]:
    """Keep the optimizer sharding the run planned: its optimizer state cannot be converted.

    A saved config that left `parallel.optimizer_sharding` to the planner would otherwise be
    re-planned (e.g. with another `--dp`) and pick a sharding the checkpoint cannot load.
    """
    from llmctl.run.rundir import read_plan

    key = "parallel.optimizer_sharding"
    if saved.parallel.optimizer_sharding is not None or any(
        o.lstrip("+~").startswith(f"{key}=") for o in overrides
    ):
        return []
    plan = read_plan(run_dir)
    return [f"{key}={plan.layout.optimizer_sharding}"] if plan is not None else []
