"""Errors a user can fix. The CLI prints them as one line and exits with code 2.

`UserError` derives from the ClickException class that Typer actually uses (recent Typer vendors
its own copy of Click), so Typer prints it as `Error: <message>` with exit code 2 and no
traceback, both from the console script and under `typer.testing.CliRunner`.
"""

from __future__ import annotations

try:  # Typer >= 0.2x ships a vendored Click
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover - older Typer uses the click package
    from click import ClickException as _ClickException  # type: ignore[assignment]


__all__ = ["UserError", "_ClickException"]


class UserError(_ClickException):
    """Bad input: an unknown name, an impossible layout, a malformed file.

    The message is one line that names the field, file or line and what was expected.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
