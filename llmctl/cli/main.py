"""The `llmctl` Typer application: one module per command group, composed here.

Commands load lazily (`llmctl.cli.lazy`): `llmctl --help` reads the table below and running a
command imports only its own module. Command modules stay light at import time too (no torch,
megatron or transformers).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from llmctl import __version__
from llmctl.cli.lazy import ClickException, LazyCommand, LazyGroup

_L = LazyCommand
COMMANDS: tuple[LazyCommand, ...] = (
    _L("topo", "llmctl.cli.topo", "topo",
       "Probe GPUs (NVML), NVLink, PCIe/NUMA, RDMA NICs, CPUs, memory and the SLURM job."),
    _L("plan", "llmctl.cli.plan", "plan",
       "Search parallel layouts; rank those that fit by predicted step time."),
    _L("train", "llmctl.cli.train", "train",
       "Train a recipe with megatron-core: locally (torchrun), over ssh (hostfile) or on SLURM."),
    _L("status", "llmctl.cli.jobs", "status",
       "Where a run stands: SLURM state (scontrol), last step and loss from metrics.jsonl."),
    _L("top", "llmctl.cli.top", "top",
       "Live view of a run: step time, tokens/s, MFU, memory beside the plan; stragglers."),
    _L("logs", "llmctl.cli.jobs", "logs",
       "Print a run's console output (SLURM output file or the launcher's copy)."),
    _L("cancel", "llmctl.cli.jobs", "cancel",
       "Stop a run through its launcher: the ranks save a checkpoint and exit."),
    _L("quantize", "llmctl.cli.quant", "quantize",
       "Quantize to a compressed-tensors model (transformers and vLLM load it) and report."),
    _L("eval", "llmctl.cli.eval", "eval_cmd",
       "Evaluate models with lm-evaluation-harness (local tasks) and held-out perplexity."),
    _L("checkpoints", "llmctl.cli.checkpoints", "checkpoints",
       "List the checkpoints of a run, newest first, and whether each would load."),
    _L("resume", "llmctl.cli.resume", "resume",
       "Resume RUN_DIR from its newest valid checkpoint (same launch path as `llmctl train`)."),
    _L("recipes", "llmctl.cli.recipes", "app", "List shipped recipes and show a resolved one."),
    _L("data", "llmctl.cli.data", "app",
       "Preprocess text into Megatron's indexed format, deduplicate it, train tokenizers."),
    _L("export", "llmctl.cli.hf", "export_app", "Export a llmctl checkpoint to another format."),
    _L("import", "llmctl.cli.hf", "import_app", "Import a model from another format."),
)  # fmt: skip
"""Every command: `llmctl --help` lists this table; a command's module loads when it runs."""


class _Root(LazyGroup):
    LAZY = COMMANDS


app = typer.Typer(
    name="llmctl",
    cls=_Root,
    help="Take an LLM training job from raw text to a quantized, servable model on megatron-core.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Show third-party warnings and progress bars (otherwise in the output's log).",
        ),
    ] = False,
) -> None:
    """llmctl: topo, plan, train, data, quantize."""
    if verbose:
        import os

        os.environ["LLMCTL_VERBOSE"] = "1"


def main() -> None:
    """Console entry point: a user error is one line on stderr and exit code 2, no traceback."""
    from llmctl.errors import UserError

    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except ClickException as exc:  # usage errors: Click's own message and code
        exc.show()
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
