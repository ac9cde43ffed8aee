"""Flatten a configuration into (dotted key, value, docstring) rows for `llmctl recipes show`."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Any

from llmctl.config.schema import RootConfig
from llmctl.resources import list_recipes, resource_dir


def describe(cfg: RootConfig) -> list[tuple[str, Any, str]]:
    """Every leaf field of `cfg` with its value and docstring, in schema order."""
    rows: list[tuple[str, Any, str]] = []
    _walk(cfg, "", rows)
    return rows


def _walk(obj: Any, prefix: str, rows: list[tuple[str, Any, str]]) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _walk(value, f"{key}.", rows)
        else:
            plain = value.value if isinstance(value, Enum) else value
            rows.append((key, plain, str(f.metadata.get("doc", ""))))


def recipe_summary(name: str) -> str:
    """What a shipped recipe reproduces: its header comment up to "Expected layout:", whole
    sentences, without the leading `name:`."""
    path: Path = resource_dir("recipes") / f"{name}.yaml"
    words: list[str] = []
    for line in path.read_text().splitlines():
        text = line.lstrip("#").strip()
        if not line.startswith("#") or not text or text.startswith("Expected layout"):
            break
        words.append(text)
    return " ".join(words).removeprefix(f"{name}:").strip()


def recipe_table() -> list[tuple[str, str]]:
    """(name, summary) of every shipped recipe."""
    return [(name, recipe_summary(name)) for name in list_recipes()]
