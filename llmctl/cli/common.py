"""Pieces shared by the commands that take a recipe: `recipe=NAME key=value ...` + short flags.

Usage in a command (`layout_flags` adds --tp --pp --vpp --cp --ep --dp --mbs --gbs --nodes
--gpus-per-node and passes them as one `LayoutFlags`)::

    @layout_flags
    def plan(args: RecipeArgs = None, cluster_file: ClusterFileOpt = None, *,
             layout: LayoutFlags) -> None:
        cfg = compose_from_cli(args, cluster_file=cluster_file, layout=layout)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from llmctl.errors import UserError
from llmctl.progress import Phase, Progress

if TYPE_CHECKING:
    from llmctl.config import RootConfig

RecipeArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="recipe=NAME (or a recipe YAML path) followed by Hydra overrides key=value.",
        show_default=False,
    ),
]
TpOpt = Annotated[int | None, typer.Option("--tp", help="Tensor-parallel size.")]
PpOpt = Annotated[int | None, typer.Option("--pp", help="Pipeline-parallel size.")]
VppOpt = Annotated[int | None, typer.Option("--vpp", help="Virtual pipeline stages per rank.")]
CpOpt = Annotated[int | None, typer.Option("--cp", help="Context-parallel size.")]
EpOpt = Annotated[int | None, typer.Option("--ep", help="Expert-parallel size.")]
DpOpt = Annotated[int | None, typer.Option("--dp", help="Data-parallel size.")]
MbsOpt = Annotated[int | None, typer.Option("--mbs", help="Micro-batch size.")]
GbsOpt = Annotated[int | None, typer.Option("--gbs", help="Global batch size.")]
NodesOpt = Annotated[int | None, typer.Option("--nodes", help="Number of nodes.")]
GpusOpt = Annotated[int | None, typer.Option("--gpus-per-node", help="GPUs per node.")]
ClusterFileOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster-file", help="Cluster description YAML (e.g. from `llmctl topo --out`)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print what would run; run nothing.")]


def split_recipe(args: list[str] | None, default: str | None = None) -> tuple[str, list[str]]:
    """Separate `recipe=NAME` (anywhere in the list) from the Hydra overrides."""
    recipe = default
    overrides: list[str] = []
    for arg in args or []:
        if arg.startswith("recipe="):
            recipe = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    if not recipe:
        raise UserError("no recipe given: pass recipe=NAME (see `llmctl recipes list`)")
    return recipe, overrides


def compose_from_cli(
    args: list[str] | None,
    *,
    cluster_file: str | None = None,
    default_recipe: str | None = None,
    layout: LayoutFlags | None = None,
) -> RootConfig:
    """Compose the run configuration from CLI arguments (recipe, overrides, layout flags)."""
    from llmctl.config import compose

    recipe, overrides = split_recipe(args, default_recipe)
    flags = layout.overrides() if layout is not None else []
    return compose(recipe, overrides + flags, cluster_file=cluster_file)


@dataclass(frozen=True, slots=True)
class LayoutFlags:
    """The ten layout flags, declared once for plan, train and resume (see `layout_flags`)."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    dp: int | None = None
    mbs: int | None = None
    gbs: int | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None

    def overrides(self) -> list[str]:
        """Hydra overrides of the flags that were given (`parallel.tp=2`, ...)."""
        from llmctl.config import flag_overrides

        return flag_overrides(**{f.name: getattr(self, f.name) for f in fields(self)})


_LAYOUT_OPTIONS: dict[str, object] = {
    "tp": TpOpt, "pp": PpOpt, "vpp": VppOpt, "cp": CpOpt, "ep": EpOpt, "dp": DpOpt,
    "mbs": MbsOpt, "gbs": GbsOpt, "nodes": NodesOpt, "gpus_per_node": GpusOpt,
}  # fmt: skip


def layout_flags(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command the ten layout options; it receives them as `layout: LayoutFlags`.

    Typer reads a command's signature, so the wrapper's signature lists the command's own
    parameters (without `layout`) followed by the ten options.
    """
    sig = inspect.signature(command, eval_str=True)
    own = [p for name, p in sig.parameters.items() if name != "layout"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=opt)
        for name, opt in _LAYOUT_OPTIONS.items()
    ]

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        values = {name: kwargs.pop(name, None) for name in _LAYOUT_OPTIONS}
        command(*args, layout=LayoutFlags(**values), **kwargs)  # type: ignore[arg-type]

    wrapper.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in own + added}
    return wrapper


OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output directory.", show_default=False)]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Overwrite an existing output that llmctl wrote.")
]
StepOpt = Annotated[int | None, typer.Option("--step", help="Checkpoint step (default: latest).")]
TokenizerOpt = Annotated[
    Path | None, typer.Option("--tokenizer", help="tokenizer.json (default: the run's).")
]


class _RichPhase(Phase):
    def __init__(self, bar: Any, task: Any) -> None:
        self.bar, self.task = bar, task

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def update(self, completed: int) -> None:
        self.bar.update(self.task, completed=completed)


class ConsoleProgress(Progress):
    """Each phase a line on stderr: spinner, name, bar, done/total, elapsed, ETA.

    Drawn when stderr is a terminal (or `LLMCTL_PROGRESS=1`, e.g. to keep it in a log).
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool = True) -> None:
        import os

        tty = (stream or sys.stderr).isatty()
        self.stream = stream
        self.enabled = enabled and (tty or os.environ.get("LLMCTL_PROGRESS") == "1")

    @contextlib.contextmanager
    def phase(self, name: str, total: int | None = None) -> Iterator[Phase]:
        """A bar for one phase (total None: spinner and elapsed time only)."""
        if not self.enabled:
            yield Phase()
            return
        from rich import progress as rp
        from rich.console import Console

        console = Console(file=self.stream or sys.stderr, stderr=self.stream is None)
        columns = [rp.SpinnerColumn(), rp.TextColumn("{task.description}"), rp.BarColumn(),
                   rp.MofNCompleteColumn(), rp.TimeElapsedColumn(), rp.TextColumn("ETA"),
                   rp.TimeRemainingColumn()]  # fmt: skip
        with rp.Progress(*columns, console=console) as bar:
            task = bar.add_task(name, total=total)
            yield _RichPhase(bar, task)
            bar.update(task, completed=total or 1, total=total or 1)


@contextlib.contextmanager
def console_progress(enabled: bool = True) -> Iterator[ConsoleProgress]:
    """Progress for a long command, drawn on the real stderr even while third-party output
    is sent to a log file (see `llmctl.progress`)."""
    yield ConsoleProgress(_real_stderr(), enabled)


def _real_stderr() -> TextIO:
    """A stream on file descriptor 2 as it is now (survives a later redirection of fd 2)."""
    import os

    if sys.stderr is not sys.__stderr__:  # typer's CliRunner: keep writing where it reads
        return sys.stderr
    return os.fdopen(os.dup(2), "w", buffering=1)
