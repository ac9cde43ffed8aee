"""`llmctl top RUN_DIR [--once] [--json] [--interval S]`: a live plain-text view of a run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from llmctl.launch.top import TopFrame


def top(
    run_dir: Annotated[str, typer.Argument(help="Run directory written by `llmctl train`.")],
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per frame, one per line.")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between frames (>= 0.5).")
    ] = 5.0,
) -> None:
    """Live view of a run: step time, tokens/s, MFU, memory beside the plan; stragglers.

    Also the step, the age of the last step, the newest checkpoint's age and the restarts;
    refreshed until the run ends. Plain text lines (no cursor control), so it reads in a
    log-only SSH session.

    Example: llmctl top runs/tiny_cpu-20261130T041500Z --interval 10
    """
    from llmctl.launch.top import render_top, watch

    def emit(frame: TopFrame) -> None:
        if as_json:
            typer.echo(json.dumps(frame.as_dict()))
        else:
            typer.echo("\n".join(render_top(frame)) + ("" if once else "\n"))

    watch(run_dir, emit, interval_s=interval, once=once)
