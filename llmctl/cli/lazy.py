"""Lazy command loading and cheap argument coercion for the `llmctl` Typer application.

Start-up is most of a short command's time (issue 12, finding 7): importing every command
module to print or run one command, and typer building a pydantic `TypeAdapter` for every
parameter of the command being run (importing pydantic on the way).

- `LazyGroup` lists commands from a static table (name, module, attribute, one-line help) and
  imports a command's module only when that command is resolved: to run it, to print its
  own `--help`, or to complete its arguments. `llmctl --help` and command-name completion read
  the table (tests/unit/cli/test_cli_lazy.py checks it against the real commands).
- `LazyGroup` is also where a `UserError` meets Typer: run in standalone mode (the default of
  `typer.testing.CliRunner`), it is shown as Typer shows a Click error, `Error: <message>`
  with the error's exit code; otherwise (the console script, `standalone_mode=False`) it is
  raised as it is, and `llmctl.cli.main.main` prints it.
- `fast_coercion` gives each parameter of a loaded command a coercion that handles the plain
  cases (str, int, float, a StrEnum value, optional and list forms of those, the defaults)
  without pydantic, and hands anything else (bad values included, for typer's own error
  messages) to typer's adapter.
"""

from __future__ import annotations

import enum
import importlib
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from typer.core import TyperCommand, TyperGroup

from llmctl.errors import UserError

try:  # Typer >= 0.2x ships a vendored Click
    from typer import _click
except ImportError:  # pragma: no cover - older Typer uses the click package
    import click as _click  # type: ignore[no-redef]

ClickException = _click.ClickException
"""The Click exception class Typer catches (its vendored Click's, or the click package's)."""

try:  # typer >= 0.2x coerces through pydantic adapters built here
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - another typer: keep its own coercion
    RuntimeParam = None  # type: ignore[assignment,misc]


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """One row of the command table."""

    name: str
    """Command name on the command line."""
    module: str
    """Module holding it (imported when the command is resolved)."""
    attr: str
    """A command function, or a `typer.Typer` sub-application."""
    help: str
    """First paragraph of its help, shown by `llmctl --help`."""


class _Placeholder(TyperCommand):
    """Stands in for an unloaded command in listings (help, completion of names)."""


class LazyGroup(TyperGroup):
    """A TyperGroup whose commands come from `LAZY` and load on first resolution."""

    LAZY: tuple[LazyCommand, ...] = ()
    _show_user_errors = False

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for row in self.LAZY:
            if row.name not in self.commands:
                self.commands[row.name] = _Placeholder(name=row.name, help=row.help)

    def load(self, name: str) -> _click.Command | None:
        """The real command `name`, importing its module on first use."""
        cmd = self.commands.get(name)
        if isinstance(cmd, _Placeholder):
            row = next(r for r in self.LAZY if r.name == name)
            cmd = self.commands[name] = build_command(row)
        return cmd

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        """Plain-case coercion for this group's own options too (the completion flags)."""
        fast_coercion(self, ctx, recurse=False)
        return super().parse_args(ctx, args)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; in standalone mode a `UserError` is shown as Click's."""
        self._show_user_errors = standalone_mode
        return super().main(
            args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra
        )

    def invoke(self, ctx: _click.Context) -> Any:
        """Run the resolved command; a `UserError` becomes Click's exception (same message and
        exit code) only in standalone mode, where Typer shows Click's exceptions."""
        try:
            return super().invoke(ctx)
        except UserError as exc:
            if not self._show_user_errors:
                raise
            shown = ClickException(exc.message)
            shown.exit_code = exc.exit_code
            raise shown from None

    def resolve_command(
        self, ctx: _click.Context, args: list[str]
    ) -> tuple[str | None, _click.Command | None, list[str]]:
        """Load the named command before click looks it up."""
        if args and isinstance(self.commands.get(args[0]), _Placeholder):
            cmd = self.load(args[0])
            assert cmd is not None
            settings = {"info_name": args[0], "parent": ctx, **cmd.context_settings}
            fast_coercion(cmd, cmd.context_class(cmd, **settings))
        return super().resolve_command(ctx, args)


def build_command(row: LazyCommand) -> _click.Command:
    """Import a row's module and build its click command the way typer would."""
    import typer
    import typer.main

    target = getattr(importlib.import_module(row.module), row.attr)
    holder = typer.Typer()
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=row.name)
    else:
        holder.command(name=row.name)(target)
    return typer.main.get_group(holder).commands[row.name]


# ---------------------------------------------------------------- parameter coercion

_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]+)?")
_MISS = object()


def _optional_inner(annotation: Any) -> Any:
    """`X` for `X | None` / `Optional[X]`, else the annotation itself."""
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _plain(annotation: Any, value: Any) -> Any:
    """`value` coerced to `annotation` for the plain cases, else `_MISS`."""
    if annotation is str:
        return value if isinstance(value, str) else _MISS
    if annotation is int:
        if type(value) is int:
            return value
        return int(value) if isinstance(value, str) and _INT.fullmatch(value) else _MISS
    if annotation is float:
        if type(value) in (int, float):
            return float(value)
        return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else _MISS
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        if isinstance(value, annotation):
            return value
        known = isinstance(value, str) and value in annotation._value2member_map_
        return annotation(value) if known else _MISS
    return _MISS


def coerce_plain(annotation: Any, value: Any) -> Any:
    """Plain-case coercion of one command-line value (or default); `_MISS` if not plain."""
    inner = _optional_inner(annotation)
    if get_origin(inner) is list and isinstance(value, list | tuple):
        (item,) = get_args(inner) or (_MISS,)
        items = [_plain(item, v) for v in value]
        return _MISS if any(i is _MISS for i in items) else items
    return _plain(inner, value)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _PlainParam(RuntimeParam):
        """Plain cases here; anything else through typer's own (pydantic) coercion."""

        descriptor: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            out = coerce_plain(self.annotation, value)
            if out is not _MISS:
                return out
            full = build_runtime_param(self.descriptor)
            param._runtime_param = full
            return full._coerce_value(value, param=param, ctx=ctx)


def fast_coercion(cmd: _click.Command, ctx: _click.Context, recurse: bool = True) -> None:
    """Install plain-case coercion on `cmd`'s parameters (help option included), run in `ctx`.

    With `recurse`, also on every subcommand, each in a context made as click would make it.
    """
    if RuntimeParam is None:
        return
    for param in cmd.get_params(ctx):
        desc = getattr(param, "type_descriptor", None)
        if desc is None or getattr(desc, "file_annotation", None) is not None:
            continue
        if getattr(param, "_runtime_param", _MISS) is None:
            plain = _PlainParam(desc.parameter_info, desc.annotation, desc)
            param._runtime_param = plain  # type: ignore[attr-defined]
    for name, sub in getattr(cmd, "commands", {}).items() if recurse else ():
        settings = {"info_name": name, "parent": ctx, **sub.context_settings}
        fast_coercion(sub, sub.context_class(sub, **settings))
