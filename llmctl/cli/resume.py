"""`llmctl resume RUN_DIR [key=value ...] [--dry-run] [--json]`: continue from a checkpoint."""

from __future__ import annotations

from typing import Annotated

import typer

from llmctl.cli.common import DryRunOpt, JsonOpt

RunDirArg = Annotated[str, typer.Argument(help="Run directory written by `llmctl train`.")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides on the saved config, e.g. train.train_iters=200 parallel.tp=2."),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Launch even if the plan predicts the layout won't fit.")
]


def resume(
    run_dir: RunDirArg,
    overrides: OverridesArg = None,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Resume RUN_DIR from its newest complete checkpoint (same launch path as `llmctl train`).

    Example: llmctl resume runs/tiny_cpu-20261130T041500Z train.train_iters=100 --tp 1
    """
    from llmctl.cli.train import _print_dry_run, _print_result
    from llmctl.launch.api import execute_train
    from llmctl.train.ckpt_resume import prepare_resume

    launch = prepare_resume(run_dir, list(overrides or []), force=force)
    if dry_run:
        _print_dry_run(launch, as_json)
        return
    result = execute_train(launch)
    _print_result(result, as_json)
    if result.get("exit_code"):
        raise typer.Exit(int(result["exit_code"]))
