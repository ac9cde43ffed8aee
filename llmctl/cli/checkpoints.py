"""`llmctl checkpoints RUN_DIR|s3://BUCKET/PREFIX [--json] [--quick]`: step, size, layout and
validity of each."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from llmctl.cli.common import JsonOpt, console_progress

RunDirArg = Annotated[
    str,
    typer.Argument(
        help="Run directory (holds checkpoints/), or a checkpoints location s3://BUCKET/PREFIX "
        "(endpoint and credentials from the AWS_* variables)."
    ),
]
QuickOpt = Annotated[
    bool, typer.Option("--quick", help="Check sizes only, not checksums (no full read).")
]


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**27 else f"{n / 2**20:.1f} MiB"


def checkpoints(run_dir: RunDirArg, as_json: JsonOpt = False, quick: QuickOpt = False) -> None:
    """List the checkpoints of a run, newest first, and whether each would load.

    Example: llmctl checkpoints runs/tiny_cpu-20261130T041500Z --json
    Example: llmctl checkpoints s3://ckpt/tiny_cpu/checkpoints --quick
    """
    from llmctl.run.ckpt_store import describe_checkpoints

    with console_progress() as progress:  # on stderr: --json stdout stays clean
        rows = describe_checkpoints(run_dir, full=not quick, progress=progress)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no checkpoints in {run_dir}")
        return
    table = Table(title=f"checkpoints of {run_dir}")
    for col in ("step", "size", "layout", "samples", "saved (UTC)", "valid"):
        table.add_column(col)
    for r in rows:
        when = r["created_unix"] and datetime.fromtimestamp(r["created_unix"], UTC).strftime(
            "%m-%d %H:%M:%S"
        )
        valid = "[green]ok[/green]" if r["valid"] else f"[red]{r['problems'][0]}[/red]"
        step = f"{r['step']} (latest)" if r["latest"] else str(r["step"])
        table.add_row(step, _gib(r["size_bytes"]), r["layout"], str(r["consumed_samples"] or "-"),
                      when or "-", valid)  # fmt: skip
    Console().print(table)
