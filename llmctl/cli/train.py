"""`llmctl train recipe=NAME key=value ... [--dry-run] [--force] [--json]`."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.syntax import Syntax

from llmctl.cli.common import (
    ClusterFileOpt,
    CpOpt,
    DpOpt,
    DryRunOpt,
    EpOpt,
    GbsOpt,
    GpusOpt,
    JsonOpt,
    MbsOpt,
    NodesOpt,
    PpOpt,
    RecipeArgs,
    TpOpt,
    VppOpt,
    split_recipe,
)

ForceOpt = Annotated[
    bool, typer.Option("--force", help="Launch even if the plan predicts the layout won't fit.")
]


def train(
    args: RecipeArgs = None,
    dry_run: DryRunOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
    cluster_file: ClusterFileOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    vpp: VppOpt = None,
    cp: CpOpt = None,
    ep: EpOpt = None,
    dp: DpOpt = None,
    mbs: MbsOpt = None,
    gbs: GbsOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusOpt = None,
) -> None:
    """Train a recipe with megatron-core: locally (torchrun), over ssh (hostfile) or on SLURM.

    Example: llmctl train recipe=tiny_cpu launcher=slurm --dp 2 --dry-run
    """
    from llmctl.config import flag_overrides
    from llmctl.launch.api import execute_train, prepare_train

    recipe, overrides = split_recipe(args)
    flags = flag_overrides(
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        ep=ep,
        dp=dp,
        mbs=mbs,
        gbs=gbs,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
    )
    launch = prepare_train(recipe, overrides + flags, cluster_file=cluster_file, force=force)
    if dry_run:
        _print_dry_run(launch, as_json)
        return
    # With --json, stdout carries only the JSON result; the run's output goes to stderr.
    result = execute_train(launch, echo=sys.stderr if as_json else None)
    _print_result(result, as_json)
    if result.get("exit_code"):
        raise typer.Exit(int(result["exit_code"]))


def _print_dry_run(launch: Any, as_json: bool) -> None:
    from llmctl.config import cfg_to_yaml

    if as_json:
        typer.echo(json.dumps({**launch.describe(), "config": cfg_to_yaml(launch.cfg)}, indent=2))
        return
    from llmctl.launch.local import shell_line

    console = Console()
    lay = launch.layout
    console.print(
        f"[bold]dry run[/bold]: launcher={launch.kind}, run dir {launch.run_dir} (not created), "
        f"layout TP={lay.tp} PP={lay.pp} CP={lay.cp} DP={lay.dp} (world {lay.world_size})"
    )
    if launch.kind == "local":
        console.print(shell_line(launch.argv, launch.env), markup=False, soft_wrap=True)
    for node in launch.nodes:
        console.print(f"# node {node.node_rank} on {node.host}", markup=False)
        console.print(shell_line(list(node.ssh_argv), {}), markup=False, soft_wrap=True)
    if launch.sbatch:
        console.print(Syntax(launch.sbatch, "bash", word_wrap=True))
    console.print("[bold]resolved config[/bold]")
    console.print(Syntax(cfg_to_yaml(launch.cfg), "yaml"))
    console.print("[bold]plan[/bold]")
    console.print_json(json.dumps(launch.plan or {}, default=str))


def _print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    elif "job_id" in result:
        typer.echo(
            f"submitted SLURM job {result['job_id']}; run dir {result['run_dir']}\n"
            f"follow: llmctl logs {result['run_dir']} --follow   status: llmctl status "
            f"{result['run_dir']}"
        )
    else:
        state = "finished" if result["exit_code"] == 0 else f"failed (exit {result['exit_code']})"
        typer.echo(f"run {state}; run dir {result['run_dir']}")
