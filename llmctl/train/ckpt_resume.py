"""`llmctl resume RUN_DIR [key=value ...]`: relaunch a run from its newest complete checkpoint.

No torch here: the run's saved config (RUN_DIR/config.yaml) is recomposed with the overrides
(more steps, a new layout, another launcher) through the same launch path as `llmctl train`;
the training processes then find the checkpoint themselves (`checkpoint.load`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmctl.errors import UserError


def prepare_resume(run_dir: str | Path, overrides: list[str], *, force: bool = False) -> Any:
    """Check the run directory and render its relaunch (starts nothing).

    Args:
        run_dir: A run directory written by `llmctl train`.
        overrides: Hydra overrides applied on top of the saved config.
        force: Launch even if the plan predicts the layout will not fit.

    Returns:
        The `llmctl.launch.api.TrainLaunch`, ready for `execute_train`.

    Raises:
        UserError: No such run directory, no saved config, or no valid checkpoint.
    """
    from llmctl.config import load_resolved
    from llmctl.launch.api import prepare_train
    from llmctl.train.ckpt_store import newest_valid
    from llmctl.train.rundir import CHECKPOINTS_DIR, CONFIG_FILE

    run_dir = Path(run_dir).resolve()
    config = run_dir / CONFIG_FILE
    if not config.is_file():
        raise UserError(
            f"{run_dir} is not a run directory (no {CONFIG_FILE}); start one with `llmctl train`"
        )
    valid, skipped = newest_valid(run_dir / CHECKPOINTS_DIR, full=False)
    if valid is None:
        why = f"; {len(skipped)} invalid ({skipped[0].reason})" if skipped else ""
        raise UserError(f"{run_dir} has no complete checkpoint to resume from{why}")
    saved = load_resolved(config)
    bad = [
        o
        for o in overrides
        if o.split("=", 1)[0].lstrip("+~") in ("train.run_dir", "checkpoint.load")
    ]
    if bad:
        raise UserError(f"resume cannot change {bad[0].split('=', 1)[0]}")
    launch = prepare_train(str(config), [*overrides, f"train.run_dir={run_dir}"], force=force)
    launch.cfg.recipe = saved.recipe
    launch.cfg.checkpoint.load = True
    return launch
