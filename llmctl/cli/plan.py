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
    ForceOpt,
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
    typer.Option(
        "--calibrate",
        help="Finished run dir (perf.json + config.yaml) to fit the cluster's step-time knobs "
        "to (repeatable); the calibrated cluster is written to --out.",
    ),
]
OutOpt = Annotated[
    str | None,
    typer.Option(
        "--out",
        "-o",
        help="With --calibrate: where to write the calibrated cluster YAML "
        "(default calibrated-<cluster>.yaml); use it later with --cluster-file.",
    ),
]
StackOpt = Annotated[
    str | None,
    typer.Option(
        "--stack",
        help="Software stack to price: megatron_te (default; Megatron-core + Transformer "
        "Engine) or pytorch_native (no TE TP overlap, synchronous DTensor TP, no p2p/MoE "
        "overlap); sets plan.stack.",
    ),
]
FromCheckpointOpt = Annotated[
    str | None,
    typer.Option(
        "--from-checkpoint",
        help="Checkpoint (or run dir: its newest) to re-plan for --nodes N: the best layout "
        "it can be resharded to (its model, batch and optimizer sharding kept).",
    ),
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
    out: OutOpt = None,
    cluster_file: ClusterFileOpt = None,
    force: ForceOpt = False,
    stack: StackOpt = None,
    from_checkpoint: FromCheckpointOpt = None,
    *,
    layout: LayoutFlags,
) -> None:
    """Search parallel layouts; rank those that fit by predicted step time.

    Example: llmctl plan recipe=llama3_70b_pretrain_64gpu_h100_fp8 --tp 4 --pp 8 --explain
    """
    from llmctl.run.planning import plan_config

    if plot:  # before any work: a plot that cannot be written is one line
        from llmctl.plotting import check_plot_path

        check_plot_path(plot)
    if stack is not None:
        args = [*(args or []), f"plan.stack={stack}"]
    dpo = None
    if from_checkpoint is not None:
        result, top_k, save_to = _from_checkpoint(from_checkpoint, args, layout, calibrate), 5, None
    else:
        cfg = compose_from_cli(args, cluster_file=cluster_file, layout=layout)
        save_to = (out or f"calibrated-{cfg.cluster.name}.yaml") if calibrate else None
        result, top_k = plan_config(cfg, calibrate, save_to, force), cfg.plan.top_k
        from llmctl.run.planning import dpo_plan

        dpo = dpo_plan(cfg, result)  # train.objective=dpo: reference and pair terms
    if as_json:
        from llmctl.plan.report import result_dict

        typer.echo(json.dumps(result_dict(result) | ({"dpo": dpo} if dpo else {}), indent=2))
    else:
        console = Console(highlight=False)
        _render(console, result)
        chosen = result.best or result.closest
        if explain and chosen is not None:
            _explain(console, result, chosen)
        if dpo:
            console.print(
                f"DPO: {dpo['pairs_per_step']:.1f} pairs ({dpo['sequences_per_step']:.0f} "
                f"sequences) per step; reference {dpo['reference']}: "
                f"{_size(dpo['reference_table_bytes'])} of log-probs per rank, no weight copy "
                f"(a frozen copy: {_size(dpo['frozen_copy_bytes'])}/GPU), "
                f"one forward pass before step 1 ~{dpo['reference_pass_s']:.1f} s"
            )
    notes = []
    if save_to:
        notes.append(f"calibrated cluster written to {save_to} (use --cluster-file {save_to})")
    if plot:
        from llmctl.plotting import plot_plan

        notes.append(f"plot written to {plot_plan(result, plot, top_k=top_k)}")
    for note in notes:
        typer.echo(note, err=as_json)


def _size(num_bytes: float) -> str:
    """Bytes in KiB, MiB or GiB, whichever reads best."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes / 2**10:.1f} KiB"


def _from_checkpoint(
    location: str, args: list[str] | None, layout: LayoutFlags, calibrate: list[str] | None
) -> PlanResult:
    """`--from-checkpoint`: the layouts on `--nodes` nodes the checkpoint reshards to; one
    line to stderr names the checkpoint and what it keeps."""
    from llmctl.errors import UserError
    from llmctl.run.reshard import plan_from_checkpoint

    if layout.nodes is None:
        raise UserError("--from-checkpoint needs --nodes N (the nodes to re-plan for)")
    if calibrate:
        raise UserError("--from-checkpoint and --calibrate do not combine; calibrate first")
    given = list(args or [])
    if any(a.startswith("recipe=") for a in given):
        raise UserError(
            "--from-checkpoint takes the model and cluster from the checkpoint; drop recipe="
        )
    result, facts = plan_from_checkpoint(location, layout.nodes, given + layout.overrides())
    saved = " ".join(
        f"{k.upper()}{facts.layout[k]}" for k in ("tp", "pp", "cp", "dp") if k in facts.layout
    )
    typer.echo(
        f"checkpoint {facts.path} (step {facts.step}, saved at {saved}, optimizer sharding "
        f"{facts.sharding}): layouts on {layout.nodes} node(s) it reshards to",
        err=True,
    )
    return result


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
    wide = console.width >= 120
    bars = console.is_terminal and wide
    legend = " ".join(f"[{c}]█[/] {n}" for n, c in COLORS.items())
    table = Table(
        title="Fastest layouts that fit" if res.ranked else "Closest layout (no fit)",
        caption=f"memory per rank of {inp.cluster.hbm_gib:g} GiB: {legend}" if bars else None,
    )
    cols = ["#", "layout", "step s", "tok/s/GPU", "MFU", "peak GiB"]
    cols += ["TFLOP/s"] if wide else []
    cols += ["memory"] if bars else []
    for col in cols:
        table.add_column(
            col,
            justify="left" if col in ("layout", "memory") else "right",
            no_wrap=col != "layout",
            ratio=1 if col == "layout" else None,
        )
    for i, ev in enumerate(shown, 1):
        r = ev.rates
        row: list[str | Text] = [
            str(i),
            ev.layout.short(),
            f"{r.step_s:.2f}",
            f"{r.tokens_per_s_per_gpu:,.0f}",
            f"{100 * r.mfu:.1f}%",
            f"{ev.memory.total_gib:.1f}",
        ]
        row += [f"{r.tflops_per_gpu:.0f}"] if wide else []
        row += [_bar(ev, inp.cluster.hbm_gib)] if bars else []
        table.add_row(*row)
    if shown:  # no valid layout at all: the rejections below say why
        console.print(table)
    for rej in res.rejections:
        plural = "s" if rej.count != 1 else ""
        console.print(f"[red]✗[/] {rej.reason} [dim]({rej.count} layout{plural})[/]")
    if res.best and res.best.rates.time_to_train_s:
        days = res.best.rates.time_to_train_s / 86400
        console.print(f"Time to train {inp.run.train_tokens:.3g} tokens: {days:.1f} days")
    if not res.ranked:
        head = "Nothing fits." if shown else "No valid layout."
        console.print(f"[bold red]{head}[/] What would:")
        for tip in res.suggestions:
            console.print(f"  • {tip}")


def _published(console: Console, res: PlanResult) -> None:
    from llmctl.plan.report import margin

    ref = res.reference
    if ref is None:
        return
    where = f"ranks #{res.reference_rank}" if res.reference_rank else "does not fit"
    console.print(
        f"\n[bold]Published layout[/] {ref.layout.short()}: {ref.rates.step_s:.2f} s, "
        f"{ref.memory.total_gib:.1f} GiB, {where}."
    )
    m = margin(res)
    if m is None:
        return
    if m["seconds"] <= 0:
        console.print("It is the fastest fitting layout the model finds.")
        return
    terms = ", ".join(f"{k} {-v:+.3f} s" for k, v in m["terms_s"].items())
    console.print(
        f"The top pick is predicted {100 * m['fraction']:.1f}% ({m['seconds']:.2f} s) faster "
        f"per step; largest differences (top pick minus published): {terms}."
    )


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
    from llmctl.plan.placement import placement_for

    place = placement_for(res.input.cluster, ev.layout)
    if place is not None:
        console.print("[bold]Placement assumed[/] (launcher=slurm asks for it and checks it):")
        for line in place.lines():
            console.print(f"  {line}")
    if res.input.model.is_moe:
        overlap = res.input.run.moe_a2a_overlap
        how = "overlapped with another micro-batch's compute" if overlap else "exposed"
        console.print(f"MoE all-to-alls (moe_comm): {how} (parallel.moe_a2a_overlap)")
    _published(console, res)
