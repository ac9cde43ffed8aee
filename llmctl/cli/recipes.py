"""`llmctl recipes list|show`: what ships, and a recipe's resolved configuration."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="List shipped recipes and show a resolved one.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


@app.command("list")
def list_cmd(as_json: JsonOpt = False) -> None:
    """List shipped recipes with what each reproduces."""
    from llmctl.config.describe import recipe_table

    rows = recipe_table()
    if as_json:
        typer.echo(json.dumps([{"name": n, "summary": s} for n, s in rows], indent=2))
        return
    table = Table("recipe", "what it reproduces")
    for name, summary in rows:
        table.add_row(name, summary)
    Console().print(table)


@app.command("show")
def show_cmd(
    recipe: Annotated[
        str, typer.Argument(help="Recipe name (or recipe=NAME) or path to a recipe YAML.")
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Hydra overrides key=value.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the resolved configuration of RECIPE with each field's docstring."""
    from llmctl.config import compose
    from llmctl.config.describe import describe

    recipe = recipe.removeprefix("recipe=")
    rows = describe(compose(recipe, overrides or []))
    if as_json:
        typer.echo(json.dumps({k: v for k, v, _ in rows}, indent=2, default=str))
        return
    table = Table("key", "value", "meaning", title=f"recipe {recipe}")
    for key, value, text in rows:
        table.add_row(key, json.dumps(value, default=str), text)
    Console().print(table)
