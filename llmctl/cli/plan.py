"""`llmctl plan recipe=NAME key=value ... [--tp 8 --pp 4] [--json] [--explain] [--plot F.png]`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from llmctl.cli.common import (
    ClusterFileOpt,
    JsonOpt,
    LayoutFlags,
    RecipeArgs,
    compose_from_cli,
    layout_flags,
)

if TYPE_CHECKING:
    from llmctl.plan import Evaluation, PlanResult

ExplainOpt = Annotated[
    bool, typer.Option("--explain", help="Break down memory and step time of the chosen layout.")
]
PlotOpt = Annotated[
    str | None, typer.Option("--plot", help="Write step time vs peak memory of all candidates.")
]
CalibrateOpt = Annotated[
    list[str] | None,
    typer.Option("--calibrate", help="Run dir with perf.json to calibrate from (repeatable)."),
]
COLORS = {
    "weights": "blue",
    "grads": "cyan",
    "optimizer": "magenta",
    "activations": "yellow",
    "fp8_buffers": "green",
    "fragmentation": "red",
    "cuda_context": "white",
    "nccl_buffers": "bright_black",
}


@layout_flags
def plan(
    args: RecipeArgs = None,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    plot: PlotOpt = None,
    calibrate: CalibrateOpt = None,
    cluster_file: ClusterFileOpt = None,
    *,
    layout: LayoutFlags,
) -> None:
    """Search parallel layouts; rank those that fit by predicted step time.

    Example: llmctl plan recipe=llama3_70b_pretrain_64gpu_h100_fp8 --tp 4 --pp 8 --explain
    """
    from llmctl.config.planning import plan_config
    from llmctl.plan.report import result_dict

    cfg = compose_from_cli(args, cluster_file=cluster_file, layout=layout)
    result = plan_config(cfg, calibrate)
    if plot:
        _plot(result, plot)
    if as_json:
        typer.echo(json.dumps(result_dict(result), indent=2))
        return
    console = Console(width=max(Console().width, 150))
    _render(console, result)
    chosen = result.best or result.closest
    if explain and chosen is not None:
        _explain(console, result, chosen)


def _bar(ev: Evaluation, hbm_gib: float, width: int = 24) -> Text:
    text = Text()
    used = 0
    for name, gib in ev.memory.terms().items():
        cells = round(gib / hbm_gib * width)
        cells = min(cells, width - used)
        text.append("█" * cells, style=COLORS[name])
        used += cells
    text.append("·" * (width - used), style="dim")
    return text


def _render(console: Console, res: PlanResult) -> None:
    inp = res.input
    console.print(
        f"[bold]{inp.model.name}[/] on {inp.cluster.world_size}x {inp.cluster.name} "
        f"({inp.cluster.num_nodes} nodes), GBS {inp.run.global_batch_size}, "
        f"{inp.run.compute_dtype}: {res.num_candidates} candidate layouts, "
        f"{sum(1 for p in res.points if p[2])} fit in {res.usable_gib:.1f} GiB"
    )
    shown = res.ranked or ((res.closest,) if res.closest else ())
    legend = " ".join(f"[{c}]█[/] {n}" for n, c in COLORS.items())
    table = Table(
        title="Fastest layouts that fit" if res.ranked else "Closest layout (no fit)",
        caption=f"memory per rank of {inp.cluster.hbm_gib:g} GiB: {legend}",
    )
    for col in ("#", "layout", "step s", "tok/s/GPU", "TFLOP/s", "MFU", "peak GiB", "memory"):
        table.add_column(
            col, justify="left" if col in ("layout", "memory") else "right", no_wrap=True
        )
    for i, ev in enumerate(shown, 1):
        r = ev.rates
        table.add_row(
            str(i),
            ev.layout.short(),
            f"{r.step_s:.2f}",
            f"{r.tokens_per_s_per_gpu:,.0f}",
            f"{r.tflops_per_gpu:.0f}",
            f"{100 * r.mfu:.1f}%",
            f"{ev.memory.total_gib:.1f} {ev.memory.stage}",
            _bar(ev, inp.cluster.hbm_gib),
        )
    console.print(table)
    for rej in res.rejections:
        console.print(f"[red]✗[/] {rej.reason} [dim]({rej.count} layouts)[/]")
    if res.best and res.best.rates.time_to_train_s:
        days = res.best.rates.time_to_train_s / 86400
        console.print(f"Time to train {inp.run.train_tokens:.3g} tokens: {days:.1f} days")
    if not res.ranked:
        console.print("[bold red]Nothing fits.[/] What would:")
        for tip in res.suggestions:
            console.print(f"  • {tip}")


def _explain(console: Console, res: PlanResult, ev: Evaluation) -> None:
    console.print(
        f"\n[bold]Explain {ev.layout.short()}[/]: layers per stage first/middle/last "
        f"{ev.split.first}/{ev.split.middle}/{ev.split.last} ({ev.split.method})"
    )
    mem = Table(title=f"Memory of the worst rank ({ev.memory.stage} stage), GiB")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    for name, gib in ev.memory.terms().items():
        mem.add_row(name, f"{gib:.2f}")
    mem.add_row("[bold]total[/]", f"[bold]{ev.memory.total_gib:.2f}[/]")
    mem.add_row("usable", f"{res.usable_gib:.2f}")
    time = Table(title="Step time, seconds")
    time.add_column("term")
    time.add_column("s", justify="right")
    time.add_column("share", justify="right")
    for name, sec in ev.time.terms().items():
        time.add_row(name, f"{sec:.3f}", f"{100 * sec / ev.time.total_s:.1f}%")
    time.add_row("[bold]total[/]", f"[bold]{ev.time.total_s:.3f}[/]", "")
    console.print(mem)
    console.print(time)


def _plot(res: PlanResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    fit = [p for p in res.points if p[2]]
    miss = [p for p in res.points if not p[2]]
    ax.scatter([p[1] for p in miss], [p[0] for p in miss], s=6, c="lightgray", label="does not fit")
    ax.scatter([p[1] for p in fit], [p[0] for p in fit], s=6, c="tab:blue", label="fits")
    ax.axvline(res.usable_gib, color="tab:red", ls="--", lw=1, label="usable HBM")
    if res.best:
        b = res.best
        ax.scatter(
            [b.memory.total_gib],
            [b.rates.step_s],
            marker="*",
            s=180,
            c="tab:orange",
            label=f"chosen: {b.layout.short()}",
        )
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("step time (s)")
    ax.set_yscale("log")
    ax.set_title(f"{res.input.model.name} on {res.input.cluster.world_size} GPUs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
