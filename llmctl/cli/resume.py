"""`llmctl resume RUN_DIR [key=value ...] [--tp N ...] [--dry-run] [--json]`: continue a run."""

from __future__ import annotations

from typing import Annotated

import typer

from llmctl.cli.common import ClusterFileOpt, DryRunOpt, JsonOpt, LayoutFlags, layout_flags
from llmctl.cli.train import ForceAliasOpt, IgnoreFitOpt, RestartOpt

RunDirArg = Annotated[str, typer.Argument(help="Run directory written by `llmctl train`.")]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Overrides on the saved config, e.g. train.train_iters=200 parallel.tp=2."),
]


@layout_flags
def resume(
    run_dir: RunDirArg,
    overrides: OverridesArg = None,
    dry_run: DryRunOpt = False,
    ignore_fit: IgnoreFitOpt = False,
    force: ForceAliasOpt = False,
    restart_from_scratch: RestartOpt = False,
    as_json: JsonOpt = False,
    cluster_file: ClusterFileOpt = None,
    *,
    layout: LayoutFlags,
) -> None:
    """Resume RUN_DIR from its newest valid checkpoint (same launch path as `llmctl train`).

    Every checkpoint is checked (checksums included) and the overrides are checked against
    the one that will load before anything starts.

    Example: llmctl resume runs/tiny_cpu-20261130T041500Z train.train_iters=100 --dp 2
    """
    from llmctl.cli.train import ignore_fit_flag, run_launch
    from llmctl.launch.ckpt_resume import prepare_resume

    launch = prepare_resume(
        run_dir,
        [*(overrides or []), *layout.overrides()],
        cluster_file=cluster_file,
        ignore_fit=ignore_fit_flag(ignore_fit, force),
        restart_from_scratch=restart_from_scratch,
    )
    run_launch(launch, dry_run=dry_run, as_json=as_json)
