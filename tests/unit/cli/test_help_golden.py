"""`llmctl --help` and every subcommand's `--help`, byte for byte (tests/golden/cli/help/).

The rooms of the house move under these commands; what a user reads must not. The console
width is pinned so the golden text does not depend on the terminal running the test.
LLMCTL_UPDATE_GOLDEN=1 rewrites the files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

try:  # Typer >= 0.2x ships a vendored Click
    from typer import _click as click
except ImportError:  # pragma: no cover - older Typer uses the click package
    import click  # type: ignore[no-redef]

from llmctl.cli.main import app

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "cli" / "help"


def _paths(cmd: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if hasattr(cmd, "list_commands"):  # a group; lazy groups load a command when resolved
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.load(name) if hasattr(cmd, "load") else cmd.get_command(ctx, name)
            assert sub is not None, name
            out += _paths(sub, (*prefix, name))
    return out


COMMANDS = _paths(typer.main.get_command(app))


def test_every_command_is_covered() -> None:
    assert len(COMMANDS) > 20, COMMANDS  # the group walk found the command tree


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "llmctl")
def test_help_is_unchanged(path: tuple[str, ...]) -> None:
    env = {"COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}
    result = CliRunner().invoke(app, [*path, "--help"], env=env)
    assert result.exit_code == 0, result.output
    name = "_".join(path) or "llmctl"
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("LLMCTL_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(result.output)
    assert golden.is_file(), f"missing golden file {golden}: run with LLMCTL_UPDATE_GOLDEN=1"
    assert result.output == golden.read_text(), f"`llmctl {' '.join(path)} --help` changed"
