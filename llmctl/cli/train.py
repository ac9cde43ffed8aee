"""`llmctl train recipe=NAME key=value ... [--dry-run] [--force] [--json]`."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmctl.cli.common import (
    ClusterFileOpt,
    DryRunOpt,
    JsonOpt,
    LayoutFlags,
    RecipeArgs,
    layout_flags,
    split_recipe,
)

if TYPE_CHECKING:
    from llmctl.launch.backend import TrainLaunch

IgnoreFitOpt = Annotated[
    bool,
    typer.Option("--ignore-fit", help="Launch even if the plan predicts the layout won't fit."),
]
# `--force` meant --ignore-fit until 0.1; kept hidden for one release (--force now means
# "overwrite" in every command that writes an output).
ForceAliasOpt = Annotated[bool, typer.Option("--force", hidden=True)]
RestartOpt = Annotated[
    bool,
    typer.Option(
        "--restart-from-scratch",
        help="If every checkpoint of the run directory is invalid, start over at step 1 "
        "(they are moved to checkpoints/invalid/) instead of refusing.",
    ),
]


@layout_flags
def train(
    args: RecipeArgs = None,
    dry_run: DryRunOpt = False,
    ignore_fit: IgnoreFitOpt = False,
    force: ForceAliasOpt = False,
    restart_from_scratch: RestartOpt = False,
    as_json: JsonOpt = False,
    cluster_file: ClusterFileOpt = None,
    *,
    layout: LayoutFlags,
) -> None:
    """Train a recipe with megatron-core: locally (torchrun), over ssh (hostfile) or on SLURM.

    Example: llmctl train recipe=tiny_cpu launcher=slurm --dp 2 --dry-run
    """
    from llmctl.launch.api import prepare_train

    recipe, overrides = split_recipe(args)
    launch = prepare_train(
        recipe,
        overrides + layout.overrides(),
        cluster_file=cluster_file,
        force=ignore_fit_flag(ignore_fit, force),
        restart_from_scratch=restart_from_scratch,
    )
    run_launch(launch, dry_run=dry_run, as_json=as_json)


def run_launch(launch: TrainLaunch, *, dry_run: bool, as_json: bool) -> None:
    """Print the dry run, or execute and print the result (`train` and `resume`).

    With --json, stdout carries only the JSON result; the run's output goes to stderr.
    """
    from llmctl.launch.api import execute_train

    if dry_run:
        print_dry_run(launch, as_json)
        return
    result = execute_train(launch, echo=sys.stderr if as_json else None)
    print_result(result, as_json)
    if result.get("exit_code"):
        raise typer.Exit(int(result["exit_code"]))


def ignore_fit_flag(ignore_fit: bool, force: bool) -> bool:
    """`--ignore-fit`, or its old spelling `--force` (said once on stderr)."""
    if force:
        typer.echo("note: --force is now --ignore-fit (--force will mean overwrite)", err=True)
    return ignore_fit or force


def print_dry_run(launch: TrainLaunch, as_json: bool) -> None:
    """Print what a launch would run. Text form: plain stdout, commands and sbatch verbatim.

    Nothing goes through rich here: a wrapped line is a different shell command, so the
    commands, the sbatch script and the config are printed byte for byte (`bash -n` accepts
    the captured sbatch section at any terminal width).
    """
    from llmctl.config import cfg_to_yaml

    if as_json:
        typer.echo(json.dumps({**launch.describe(), "config": cfg_to_yaml(launch.cfg)}, indent=2))
        return
    typer.echo(dry_run_text(launch), nl=False)


def dry_run_text(launch: TrainLaunch) -> str:
    """The text form of `--dry-run`: a summary line, then one `# --- name ---` section each."""
    from llmctl.config import cfg_to_yaml

    lay = launch.layout
    state = "left as it is" if launch.run_dir.exists() else "not created"
    lines = [
        f"dry run: launcher={launch.kind}, run dir {launch.run_dir} ({state}), "
        f"layout TP={lay.tp} PP={lay.pp} CP={lay.cp} DP={lay.dp} (world {lay.world_size})"
    ]
    point = launch.resume_point
    if point is not None:
        start = f"checkpoint of step {point.step}" if point.step is not None else "step 1"
        lines.append(f"resume: from {start}")
        lines += [f"  invalid, moved aside on launch: {v.path} ({v.reason})" for v in point.invalid]
    for title, text in launch.rendering.sections():  # the backend's commands or script
        lines += [f"# --- {title} ---", text]
    lines += ["# --- resolved config ---", cfg_to_yaml(launch.cfg).rstrip("\n")]
    lines += ["# --- plan ---", json.dumps(launch.plan.as_dict(), indent=2, default=str)]
    return "\n".join(lines) + "\n"


_SUBMITTED = {"kubernetes": "Kubernetes job"}  # else a SLURM job


def print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    elif "job_id" in result:
        typer.echo(
            f"submitted {_SUBMITTED.get(result['kind'], 'SLURM job')} {result['job_id']}; "
            f"run dir {result['run_dir']}\n"
            f"follow: llmctl logs {result['run_dir']} --follow   status: llmctl status "
            f"{result['run_dir']}"
        )
    else:
        state = "finished" if result["exit_code"] == 0 else f"failed (exit {result['exit_code']})"
        why = f": {result['reason']}" if result.get("reason") else ""
        typer.echo(f"run {state}{why}; run dir {result['run_dir']}")
