"""The `llmctl` Typer application: one module per command group, composed here.

Command modules stay light at import time (no torch, megatron or transformers): `llmctl --help`
must answer in well under a second.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from llmctl import __version__

app = typer.Typer(
    name="llmctl",
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


def _register() -> None:
    """Attach every command group. Each line imports one light CLI module."""
    from llmctl.cli import plan, recipes, topo

    app.add_typer(recipes.app, name="recipes")
    app.command(name="topo")(topo.topo)
    app.command(name="plan")(plan.plan)
    from llmctl.cli import train as train_cli

    app.command(name="train")(train_cli.train)
    from llmctl.cli import jobs

    app.command(name="status")(jobs.status)
    app.command(name="logs")(jobs.logs)
    from llmctl.cli import data

    app.add_typer(data.app, name="data")
    from llmctl.cli import quant

    app.add_typer(quant.export_app, name="export")
    from llmctl.cli import hf

    app.add_typer(hf.import_app, name="import")
    app.command(name="quantize")(quant.quantize)
    from llmctl.cli import checkpoints, resume

    app.command(name="checkpoints")(checkpoints.checkpoints)
    app.command(name="resume")(resume.resume)


_register()


def main() -> None:
    """Console entry point: a user error is one line on stderr and exit code 2, no traceback."""
    from llmctl.errors import UserError, _ClickException

    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except _ClickException as exc:  # usage errors: Click's own message and code
        exc.show()
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
