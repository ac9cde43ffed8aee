"""`llmctl eval`: parse, call one library function, render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from llmctl.cli.common import DryRunOpt, JsonOpt, StepOpt, TokenizerOpt, console_progress


def _num(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


Row = tuple[str, list[float | None], float | None, str]


def _rows(data: dict[str, Any]) -> list[Row]:
    """(name, value per model, delta, stderr text) for every task metric, then perplexity."""
    models, deltas, rows = data["models"], data["deltas"], []
    for task in data["tasks"]:
        for metric in models[0]["tasks"][task]:
            if metric.endswith("_stderr"):
                continue
            values = [m["tasks"][task].get(metric) for m in models]
            errs = [m["tasks"][task].get(f"{metric}_stderr") for m in models]
            err = " / ".join(f"±{e:.4f}" for e in errs if e is not None)
            delta = deltas["tasks"][task].get(metric) if deltas else None
            rows.append((f"{task} {metric}", values, delta, err))
    name = f"perplexity ({models[0]['predicted_tokens']} tokens)"
    ppl = [m["perplexity"] for m in models]
    rows.append((name, ppl, deltas["perplexity"] if deltas else None, ""))
    return rows


def _render(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    models = data["models"]
    table = Table(title="llmctl eval")
    table.add_column("")
    for m in models:
        step = "" if m["step"] is None else f"@{m['step']}"
        table.add_column(f"{Path(m['path']).name}{step}",
                         justify="right")  # fmt: skip
    if len(models) == 2:
        table.add_column("delta", justify="right")
    table.add_column("stderr", justify="right")
    for name, values, delta, err in _rows(data):
        cells = [_num(v) for v in values]
        if len(values) == 2:
            cells.append("n/a" if delta is None else f"{delta:+.4f}")
        table.add_row(name, *cells, err)
    times = [f"{m['lm_eval_s'] + m['perplexity_s']:.1f} s" for m in models]
    table.add_row("wall time (lm-eval + perplexity)", *times, *([""] * (len(models) == 2)), "")
    console = Console()
    console.print(table)
    if data["heldout"]:
        console.print(f"held-out: {data['heldout']['what']}", highlight=False)
    for note in data["notes"]:
        console.print(f"note: {note}", highlight=False)


def _render_plan(data: dict[str, Any]) -> None:
    say = typer.echo
    say("evaluation plan (dry run: nothing loaded)")
    say(f"tasks: {', '.join(data['tasks'])} (from {', '.join(data['tasks_dirs'])})")
    held = data["heldout"]
    say(f"held-out: {held['what'] if held else 'none'}")
    for m, cmd in zip(data["models"], data["lm_eval"], strict=True):
        step = f" step {m['step']}" if m["step"] is not None else ""
        quant = f", {m['quantization']}" if m["quantization"] else ""
        say(f"model {m['path']} ({m['kind']}{step}, {m['architecture']}{quant}): perplexity on "
            f"{m['perplexity_windows']} windows of {m['seq_len']} tokens")  # fmt: skip
        say(f"  task numbers as: {cmd}")
    for note in data["notes"]:
        say(f"note: {note}")


def eval_cmd(
    source: Annotated[
        Path,
        typer.Argument(
            help="A llmctl run directory, a Hugging Face model dir or a quantize output."
        ),
    ],
    vs: Annotated[
        Path | None,
        typer.Option("--vs", help="A second model, evaluated the same way, side by side."),
    ] = None,
    task: Annotated[
        list[str] | None,
        typer.Option("--task", help="lm-eval task (repeat; default llmctl_arith, shipped)."),
    ] = None,
    tasks_dir: Annotated[
        Path | None, typer.Option("--tasks-dir", help="Folder of your own lm-eval task YAMLs.")
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="Held-out FILE.jsonl|FILE.txt|PREFIX for perplexity (default: a run's own "
            "validation split).",
        ),
    ] = None,
    tokenizer: TokenizerOpt = None,
    step: StepOpt = None,
    vs_step: Annotated[
        int | None, typer.Option("--vs-step", help="Checkpoint step of a --vs run directory.")
    ] = None,
    seq_len: Annotated[
        int, typer.Option("--seq-len", help="Perplexity window (capped at the model's positions).")
    ] = 512,
    eval_tokens: Annotated[
        int, typer.Option("--eval-tokens", help="Held-out tokens scored (at most).")
    ] = 16384,
    batch_size: Annotated[int, typer.Option("--batch-size", help="lm-eval batch size.")] = 1,
    limit: Annotated[
        int | None, typer.Option("--limit", help="lm-eval: at most N documents per task.")
    ] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N].")] = "cpu",
    no_perplexity: Annotated[
        bool, typer.Option("--no-perplexity", help="Run the tasks only.")
    ] = False,
    write_tasks: Annotated[
        Path | None,
        typer.Option(
            "--write-tasks",
            help="Also write llmctl's task YAMLs into DIR (the shown lm_eval command reads them).",
        ),
    ] = None,
    json_out: JsonOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Evaluate models with lm-evaluation-harness (local tasks) and held-out perplexity."""
    from llmctl.eval.evaluate import EvalRequest, plan_eval, run_eval

    request = EvalRequest(
        source=source, vs=vs, tasks=tuple(task or ("llmctl_arith",)), tasks_dir=tasks_dir,
        data=data, tokenizer=tokenizer, step=step, vs_step=vs_step, seq_len=seq_len,
        num_eval_tokens=eval_tokens, batch_size=batch_size, limit=limit, device=device,
        perplexity=not no_perplexity, write_tasks=write_tasks,
    )  # fmt: skip
    plan = plan_eval(request)
    if dry_run:
        payload = plan.as_dict()
        typer.echo(json.dumps(payload, indent=2)) if json_out else _render_plan(payload)
        return
    with console_progress() as progress:  # stderr: --json stdout stays clean
        report = run_eval(plan, progress)
    payload = report.as_dict()
    typer.echo(json.dumps(payload, indent=2)) if json_out else _render(payload)
