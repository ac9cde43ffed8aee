"""Lazy command loading (issue 12, finding 7): `llmctl --help` lists every command from a static
table, running a command imports only its own module, and the plain-case coercion that spares
pydantic gives exactly what typer's own (pydantic) coercion gives."""

from __future__ import annotations

import enum
import subprocess
import sys

from typer import _click
from typer._coercion import build_runtime_param
from typer.testing import CliRunner

from llmctl.cli.lazy import _MISS, build_command, coerce_plain
from llmctl.cli.main import COMMANDS, app


def _all_commands() -> list[tuple[str, _click.Command]]:
    out: list[tuple[str, _click.Command]] = []

    def walk(path: str, cmd: _click.Command) -> None:
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(f"{path} {name}", sub)

    for row in COMMANDS:
        walk(row.name, build_command(row))
    return out


def test_table_help_is_each_commands_own_and_help_lists_all() -> None:
    listing = " ".join(CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"}).output.split())
    for row in COMMANDS:
        real = build_command(row)
        assert (real.help or "").split("\n\n")[0].strip() == row.help, row.name
        assert f"{row.name} {row.help}" in listing, row.name


def test_running_one_command_imports_no_other_command_module() -> None:
    code = (
        "import sys\nfrom llmctl.cli.main import main\n"
        "sys.argv = ['llmctl', 'recipes', 'list', '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('llmctl.cli.') or m == 'pydantic'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.strip().splitlines()[-1]
    assert loaded == "['llmctl.cli.lazy', 'llmctl.cli.main', 'llmctl.cli.recipes']", loaded


def _samples(annotation: object) -> list[object]:
    values: list[object] = ["0", "12", "-3", "007", "0.8", "-2.5", "1e3", " 4", "x", "", "True"]
    inner = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    for t in [annotation, *inner]:
        if isinstance(t, type) and issubclass(t, enum.Enum):
            values += [m.value for m in t] + list(t) + [str(m.value).upper() for m in t]
    return [*values, ("a", "b"), ["c"], ()]


def test_plain_coercion_equals_typers_on_every_parameter() -> None:
    checked = 0
    for path, cmd in _all_commands():
        ctx = _click.Context(cmd, info_name=path)
        for param in cmd.get_params(ctx):
            desc = getattr(param, "type_descriptor", None)
            if desc is None or desc.file_annotation is not None:
                continue
            full = build_runtime_param(desc)
            for value in [param.default, *_samples(desc.annotation)]:
                if value is None:
                    continue
                plain = coerce_plain(desc.annotation, value)
                if plain is _MISS:
                    continue
                expected = full._coerce_value(value, param=param, ctx=ctx)
                assert plain == expected and type(plain) is type(expected), (path, param.name)
                checked += 1
    assert checked > 200
