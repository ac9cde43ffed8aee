"""What every `llmctl data` command owes a bad input line: one line, rc 2, nothing written."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from llmctl.cli.main import app


def assert_line_refused(args: list[str], src: Path, line: int, expected: str, out: Path) -> None:
    """`llmctl ARGS` exits 2 with one message naming `src:line` and `expected`, no traceback,
    and leaves the folder `out` empty (or absent)."""
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert f"{src}:{line}: " in result.output and expected in result.output, result.output
    assert "Traceback" not in result.output
    left = list(out.iterdir()) if out.exists() else []
    assert left == []
