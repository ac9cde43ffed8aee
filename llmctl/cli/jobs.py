"""`llmctl status RUN_DIR|JOBID`, `llmctl logs RUN_DIR [--follow]`, `llmctl cancel RUN_DIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from llmctl.launch.jobs import RunStatus

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]


def status(
    target: Annotated[str, typer.Argument(help="Run directory or SLURM job id.")],
    as_json: JsonOpt = False,
) -> None:
    """Where a run stands: SLURM state (scontrol), last step and loss from metrics.jsonl."""
    from llmctl.launch.jobs import run_status

    st = run_status(target)
    if as_json:
        from llmctl.run.prom import status_metrics  # the numbers Prometheus gets (--json only)
        from llmctl.run.straggler import current_stragglers

        metrics = status_metrics(Path(st.run_dir)) if st.run_dir else None
        strag = current_stragglers(Path(st.run_dir)) if st.run_dir else []
        typer.echo(json.dumps({**st.as_dict(), "metrics": metrics, "stragglers": strag}, indent=2))
        return
    job = f" job {st.job_id}" if st.job_id else ""
    Console().print(f"[bold]{st.kind}{job}[/bold]: {state_text(st)}", highlight=False)
    if st.step is not None:
        loss = f", loss {st.loss:.4f}" if isinstance(st.loss, float) else ""
        Console().print(f"step {st.step}/{st.total_steps or '?'}{loss}", highlight=False)
    if st.run_dir:
        from llmctl.run.straggler import straggler_text

        if text := straggler_text(Path(st.run_dir)):
            Console().print(text, highlight=False)
        Console().print(f"run dir {st.run_dir}", highlight=False)
    if st.layout and st.layout["changes"]:
        lay, last = st.layout, st.layout["last_change"]
        Console().print(
            f"layout {lay['current']} (started as {lay['original']}; {lay['changes']} elastic "
            f"change(s), last: {last['reason']})",
            highlight=False,
            soft_wrap=True,
        )
    if st.storage:
        from llmctl.run.ckpt_upload import storage_text

        Console().print(storage_text(st.storage), highlight=False, soft_wrap=True)


def state_text(st: RunStatus) -> str:
    """The state with what explains it: SLURM's reason, or the exit code of a finished run
    (for a job SLURM has forgotten, the one its batch script recorded in launch.json)."""
    if st.state == "GONE" and st.exit_code:
        return f"GONE (SLURM forgot the job; exit code {st.exit_code} recorded in launch.json)"
    if st.reason and st.reason != "None":
        return f"{st.state} ({st.reason})"
    if st.state in ("FAILED", "EXITED") and st.exit_code not in (None, "", "0", "0:0"):
        return f"{st.state} (exit code {st.exit_code})"
    return str(st.state)


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
        typer.echo(f"-- {final.kind} run {state_text(final)}", err=True)


_ENDED = ("COMPLETED", "FAILED", "EXITED", "GONE", "CANCELLED", "TIMEOUT")


def cancel(
    run_dir: Annotated[str, typer.Argument(help="Run directory.")],
    as_json: JsonOpt = False,
) -> None:
    """Stop a run through its launcher: the ranks save a checkpoint and exit."""
    from llmctl.launch.jobs import cancel_run, run_status

    before = run_status(run_dir)
    ended = before.state in _ENDED
    if not ended:
        cancel_run(run_dir)
    if as_json:
        typer.echo(json.dumps({"run_dir": str(Path(run_dir)), "kind": before.kind,
                               "state_before": before.state, "cancelled": not ended}))  # fmt: skip
        return
    if ended:
        Console().print(f"{before.kind} run {run_dir} is not running ({state_text(before)}); "
                        "nothing to stop", highlight=False)  # fmt: skip
        return
    Console().print(
        f"{before.kind} run {run_dir}: stop requested (was {state_text(before)}); the ranks "
        f"save a checkpoint and exit; `llmctl resume {run_dir}` continues it",
        highlight=False,
    )
