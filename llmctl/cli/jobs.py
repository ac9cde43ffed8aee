"""`llmctl status RUN_DIR|JOBID` and `llmctl logs RUN_DIR [--follow]`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]


def status(
    target: Annotated[str, typer.Argument(help="Run directory or SLURM job id.")],
    as_json: JsonOpt = False,
) -> None:
    """Where a run stands: SLURM state (scontrol), last step and loss from metrics.jsonl."""
    from llmctl.launch.jobs import run_status

    st = run_status(target)
    if as_json:
        typer.echo(json.dumps(st.as_dict(), indent=2))
        return
    job = f" job {st.job_id}" if st.job_id else ""
    extra = f" ({st.reason})" if st.reason and st.reason != "None" else ""
    Console().print(f"[bold]{st.kind}{job}[/bold]: {st.state}{extra}", highlight=False)
    if st.step is not None:
        loss = f", loss {st.loss:.4f}" if isinstance(st.loss, float) else ""
        Console().print(f"step {st.step}/{st.total_steps or '?'}{loss}", highlight=False)
    if st.run_dir:
        Console().print(f"run dir {st.run_dir}", highlight=False)


def logs(
    run_dir: Annotated[str, typer.Argument(help="Run directory.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the run finishes.")
    ] = False,
) -> None:
    """Print a run's console output (SLURM output file or the launcher's copy)."""
    from llmctl.launch.jobs import follow_logs

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    final = follow_logs(run_dir, write, follow=follow)
    if final is not None:
        typer.echo(f"-- {final.kind} run {final.state}", err=True)
