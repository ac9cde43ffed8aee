"""`llmctl import hf` and `llmctl export hf`: parse, call one library function, render."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from llmctl.cli.common import (
    DryRunOpt,
    ForceOpt,
    JsonOpt,
    OutOpt,
    StepOpt,
    TokenizerOpt,
    console_progress,
)

import_app = typer.Typer(help="Import a model from another format.", no_args_is_help=True)
export_app = typer.Typer(help="Export a llmctl checkpoint to another format.", no_args_is_help=True)


@contextlib.contextmanager
def _layer_bar(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr, advanced once per converted layer."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from llmctl.cli.common import _real_stderr

    columns = [BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    # the real stderr: third-party output goes to OUT/import.log while the import runs
    console = Console(file=_real_stderr())
    with Progress("layers", *columns, console=console, redirect_stderr=False) as bar:
        task = bar.add_task("layers", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _render_plan(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{data['architecture']} -> megatron-core (layer 0 shown of "
                        f"{data['num_layers_mapped']})")  # fmt: skip
    for col in ("megatron-core", "Hugging Face", "op"):
        table.add_column(col, overflow="fold")
    for row in data["mapping"]:
        table.add_row(row["megatron"], "\n".join(row["hf"]), row["op"])
    console.print(table)
    console.print(f"{data['num_parameters']:,} parameters, {data['size_bytes'] / 2**20:.1f} MiB "
                  f"({data['dtype']})\nmodel config group:")  # fmt: skip
    for key, value in data["model"].items():
        console.print(f"  {key}: {value}", highlight=False)


@import_app.command("hf")
def import_hf(
    src: Annotated[
        Path,
        typer.Argument(
            help="Hugging Face model directory (config.json, *.safetensors, tokenizer)."
        ),
    ],
    out: Annotated[Path | None, typer.Option("--out", help="Output directory.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="model.name (default: DIR's).")] = None,
    vocab_multiple: Annotated[
        int, typer.Option("--vocab-multiple", help="Pad the vocabulary to a multiple of this.")
    ] = 128,
    tp: Annotated[int, typer.Option("--tp", help="Largest TP the checkpoint must split over.")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="auto (as stored), fp32 or bf16.")] = "auto",
    force: Annotated[
        bool, typer.Option("--force", help="Replace an output an earlier import wrote.")
    ] = False,
    dry_run: DryRunOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Convert a Hugging Face model (Llama, Mistral, Qwen2, Mixtral) to megatron-core."""
    from llmctl.errors import UserError
    from llmctl.hf.importer import check_import_out, plan_import
    from llmctl.hf.importer import import_hf as run_import

    plan = plan_import(src, name=name, vocab_multiple=vocab_multiple, tp=tp, dtype=dtype)
    if dry_run:
        if json_out:
            typer.echo(json.dumps(plan.as_dict(), indent=2))
        else:
            _render_plan(plan.as_dict())
        return
    if out is None:
        raise UserError("--out is required (the directory the checkpoint is written to)")
    check_import_out(out, force)  # before the bar: a refusal is the one line
    with _layer_bar(enabled=not json_out) as bar:
        result = run_import(plan, out, force=force, on_progress=bar)
    data = result.as_dict()
    if json_out:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(
        f"imported {src} ({data['architecture']}, {data['num_parameters']:,} parameters) -> "
        f"{data['out']} in {data['seconds']:.1f} s; recipe: {data['out']}/recipe.yaml"
    )


@export_app.command("hf")
def export_hf(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (config.yaml, checkpoints/).")],
    out: OutOpt,
    step: StepOpt = None,
    tokenizer: TokenizerOpt = None,
    force: ForceOpt = False,
    adapter: Annotated[
        bool,
        typer.Option(
            "--adapter", help="LoRA run: write its PEFT adapter directory, not the merged model."
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a Hugging Face directory (Llama, Mistral, Qwen2, Mixtral or GPT-2) from a run."""
    from llmctl.hf.export import export_run

    with console_progress() as progress:  # on stderr: --json stdout stays clean
        result = export_run(
            run_dir,
            out,
            step=step,
            tokenizer=tokenizer,
            force=force,
            adapter=adapter,
            progress=progress,
        )
    if json_out:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    if adapter:
        typer.echo(
            f"exported the LoRA adapters of step {result.step} -> {result.out} (PEFT, "
            f"{result.num_parameters:,} parameters, {result.size_bytes / 2**20:.2f} MiB; "
            f"base {result.base})"
        )
        return
    typer.echo(
        f"exported step {result.step} -> {result.out} ({result.architecture}, "
        f"{result.num_parameters:,} parameters, {result.size_bytes / 2**20:.1f} MiB)"
    )
