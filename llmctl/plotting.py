"""Figures of planner results (matplotlib, imported only here).

`plot_plan` draws step time against peak memory per GPU for every candidate layout: the
x-axis is clipped around the usable HBM (layouts far beyond it are counted in the legend, not
drawn), fitting layouts are coloured by TP x PP, the top-k and the published layout (if the
recipe names one) are labelled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.plan import Evaluation, PlanResult

#: x-axis upper limit as a multiple of the usable HBM.
X_CLIP = 1.6
#: y-axis upper limit as a multiple of the fastest fitting step time.
Y_CLIP = 2.0


#: File types `plot_plan` writes, by suffix.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
#: Written into every figure's metadata: an existing file holding it is llmctl's to replace.
_CREATOR = "llmctl plan"


def check_plot_path(path: str | Path) -> Path:
    """Where `--plot` may write: a .png/.svg/.pdf name in a writable folder, absent or an
    earlier `llmctl plan --plot` figure.

    Raises:
        UserError: Another suffix, a folder or unwritable place, or a file llmctl did not write.
    """
    from llmctl.staging import check_writable_parent

    out = Path(path)
    if out.suffix.lower() not in PLOT_SUFFIXES:
        raise UserError(f"--plot {out}: expected a file name ending in .png, .svg or .pdf")
    check_writable_parent(out)
    if out.is_dir():
        raise UserError(f"--plot {out} is a folder; expected an image file name")
    if out.exists() and _CREATOR.encode() not in out.read_bytes():
        raise UserError(
            f"{out} exists and was not written by `llmctl plan --plot`; not replacing it "
            "(choose another --plot)"
        )
    return out


def plot_plan(res: PlanResult, path: str | Path, top_k: int = 5) -> Path:
    """Write the step-time vs memory figure of `res` to `path` (PNG, SVG or PDF by suffix).

    Raises:
        UserError: As `check_plot_path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = check_plot_path(path)
    if not res.points:
        raise UserError(f"--plot {out}: no valid layout to plot (the rejections above say why)")
    xmax = res.usable_gib * X_CLIP
    fastest = min((p[0] for p in res.points if p[2]), default=min(p[0] for p in res.points))
    ymax = fastest * Y_CLIP
    fig, ax = plt.subplots(figsize=(10, 5.8))
    shown = [p for p in res.points if p[1] <= xmax and p[0] <= ymax]
    miss = [p for p in shown if not p[2]]
    ax.scatter([p[1] for p in miss], [p[0] for p in miss], s=5, c="0.85", label="does not fit")
    groups = sorted({(p[3], p[4]) for p in shown if p[2]})
    tab20 = plt.get_cmap("tab20")
    colors = [tab20(i) for i in range(20) if i not in (14, 15)]
    for i, (tp, pp) in enumerate(groups):
        pts = [p for p in shown if p[2] and (p[3], p[4]) == (tp, pp)]
        color = colors[i % len(colors)]
        marker = "o" if i < len(colors) else "^"
        ax.scatter(
            [p[1] for p in pts],
            [p[0] for p in pts],
            s=8,
            color=color,
            marker=marker,
            label=f"TP{tp} PP{pp}",
        )
    ax.axvline(res.usable_gib, color="tab:red", ls="--", lw=1, label="usable HBM")
    for i, ev in enumerate(res.ranked[:top_k], 1):
        _label(ax, ev, f"#{i}", "black", "*", (-55, 24 - 9 * i))
    if res.reference is not None:
        rank = res.reference_rank
        name = f"published (#{rank})" if rank else "published (does not fit)"
        _label(ax, res.reference, name, "tab:red", "D", (6, 8))
    hidden = len(res.points) - len(shown)
    ax.set_xlim(0, xmax)
    ax.set_ylim(fastest * 0.9, ymax)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("predicted step time (s)")
    inp = res.input
    ax.set_title(
        f"{inp.model.name} on {inp.cluster.world_size}x {inp.cluster.name}, "
        f"GBS {inp.run.global_batch_size}, {inp.run.compute_dtype}: "
        f"{sum(1 for p in res.points if p[2])} of {len(res.points)} layouts fit"
        + (f" ({hidden} off the axes)" if hidden else ""),
        fontsize=9,
    )
    names = [
        f"#{i} {ev.layout.short()} ({ev.rates.step_s:.2f} s)"
        for i, ev in enumerate(res.ranked[:top_k], 1)
    ]
    if res.reference is not None:
        names.append(
            f"published: {res.reference.layout.short()} ({res.reference.rates.step_s:.2f} s)"
        )
    ax.text(
        0.01,
        0.99,
        "\n".join(names),
        transform=ax.transAxes,
        va="top",
        fontsize=6.5,
        family="monospace",
        bbox={"facecolor": "white", "alpha": 0.85, "lw": 0},
    )
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    key = "Software" if out.suffix.lower() == ".png" else "Creator"
    _save(fig, out, key)
    plt.close(fig)
    return out


def _save(fig: Any, out: Path, key: str) -> None:
    """Write the figure whole: into a temporary name in a created folder, renamed into place
    (a missing folder was a FileNotFoundError traceback after the plan)."""
    tmp = out.with_name(f".{out.stem}.llmctl-partial-{os.getpid()}{out.suffix}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(tmp, dpi=130, metadata={key: _CREATOR})
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None


def _label(
    ax: object, ev: Evaluation, text: str, color: str, marker: str, offset: tuple[int, int]
) -> None:
    x, y = ev.memory.total_gib, ev.rates.step_s
    ax.scatter([x], [y], marker=marker, s=60, c=color, zorder=5, edgecolors="white")  # type: ignore[attr-defined]
    ax.annotate(  # type: ignore[attr-defined]
        text,
        (x, y),
        xytext=offset,
        textcoords="offset points",
        fontsize=7,
        color=color,
        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": color},
    )
