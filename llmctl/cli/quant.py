"""`llmctl quantize`: parse, call one library function, render."""

from __future__ import annotations

import json
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
from llmctl.quant.schemes import Algorithm, Preset, Scheme


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _ppl(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _render_report(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{data['scheme']} {data['algorithm']} -> {data['out']}")
    for col in ("", "before", "after", "change"):
        table.add_column(col, justify="right" if col else "left")
    size_ratio = data["size_after_bytes"] / max(data["size_before_bytes"], 1)
    table.add_row(
        "weights size",
        _mib(data["size_before_bytes"]),
        _mib(data["size_after_bytes"]),
        f"x{size_ratio:.3f}",
    )
    table.add_row(
        "bits/weight (quantized Linears)",
        str(data["source_bits_per_weight"]),
        f"{data['bits_per_weight']:.3f}",
        f"theory {data['theoretical_bits_per_weight']:.3f}",
    )
    change = data["perplexity_change_pct"]
    table.add_row(
        f"perplexity ({data['num_eval_tokens']} held-out tokens)",
        _ppl(data["perplexity_before"]),
        _ppl(data["perplexity_after"]),
        "n/a" if change is None else f"{change:+.3f}%",
    )
    phases = ", ".join(f"{k} {v:.1f}s" for k, v in data["phase_s"].items())
    table.add_row("wall time", "", f"{data['wall_s']:.1f} s", phases)
    table.add_row("peak RSS", "", _mib(data["peak_rss_bytes"]), "")
    console = Console()
    console.print(table)
    for note in data.get("notes", []):
        console.print(f"note: {note}", highlight=False)


def _render_plan(data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="quantization plan (dry run: nothing written)")
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        table.add_row(key, str(value))
    Console().print(table)


PRESETS = tuple(p.value for p in Preset)


def _check_preset(value: str) -> str:
    """A shipped preset name or a YAML path: anything else is a usage error (exit 2)."""
    if value in PRESETS or value.endswith((".yaml", ".yml")):
        return value
    raise typer.BadParameter(f"{value!r} is not one of {', '.join(PRESETS)} or a FILE.yaml")


def quantize(
    source: Annotated[Path, typer.Argument(help="A llmctl run directory or a HF model dir.")],
    out: OutOpt,
    preset: Annotated[
        str,
        typer.Option(
            "--preset",
            metavar=f"{'|'.join(PRESETS)}|FILE.yaml",
            help="A shipped preset (configs/quant/) or your own preset YAML.",
            callback=_check_preset,
            autocompletion=lambda: list(PRESETS),
        ),
    ] = Preset.default.value,
    scheme: Annotated[Scheme | None, typer.Option("--scheme", case_sensitive=False)] = None,
    algorithm: Annotated[
        Algorithm | None, typer.Option("--algorithm", case_sensitive=False)
    ] = None,
    group_size: Annotated[
        int | None,
        typer.Option(
            "--group-size",
            help="Weight group size (<= 0: per channel; default: the preset's, or the largest "
            "of 128/64/32/16 that divides the model).",
        ),
    ] = None,
    ignore: Annotated[
        list[str] | None,
        typer.Option(
            "--ignore", help="Also leave this module unquantized (repeat; 're:' for regex)."
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="Indexed dataset prefix, or a .jsonl/.txt file tokenized with the model's own "
            "tokenizer (default: the run's; RTN weight-only and FP8 need none).",
        ),
    ] = None,
    tokenizer: TokenizerOpt = None,
    num_samples: Annotated[
        int | None, typer.Option("--num-samples", help="Calibration sequences.")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="Tokens per calibration sequence.")
    ] = None,
    eval_tokens: Annotated[
        int, typer.Option("--eval-tokens", help="Held-out tokens scored before and after.")
    ] = 16384,
    step: StepOpt = None,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Quantize to a compressed-tensors model (transformers and vLLM load it) and report."""
    from llmctl.quant.quantize import quantize_source

    with console_progress(enabled=not dry_run) as progress:  # stderr: --json stdout stays clean
        result = quantize_source(
            source, out, preset=preset, scheme=scheme,
            algorithm=algorithm, group_size=group_size, ignore=ignore, num_samples=num_samples,
            seq_len=seq_len, data=data, tokenizer=tokenizer, step=step,
            num_eval_tokens=eval_tokens, force=force, dry_run=dry_run, progress=progress,
        )  # fmt: skip
    payload = result.as_dict()
    if json_out:
        typer.echo(json.dumps(payload, indent=2))
    elif dry_run:
        _render_plan(payload)
    else:
        _render_report(payload)
