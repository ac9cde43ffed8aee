"""Errors a user can fix. The CLI prints them as one line and exits with code 2.

`UserError` is a plain exception: library code raises it without knowing about the CLI. The
CLI translates it at its boundary (`llmctl.cli.lazy.LazyGroup`): the console script prints
`error: <message>`, and Typer (under `typer.testing.CliRunner`, say) shows it as its own
`Error: <message>`, both with the error's exit code and no traceback.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """Bad input: an unknown name, an impossible layout, a malformed file.

    The message is one line that names the field, file or line and what was expected.
    """

    exit_code = 2
    """The process exit code of a command that stops on this error."""

    def __init__(self, message: str) -> None:
        self.message = " ".join(str(message).split())
        """The one-line message (whitespace runs, newlines included, folded to one space)."""
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message
