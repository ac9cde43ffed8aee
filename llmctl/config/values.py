"""Small helpers over configuration values shared by the library (no heavy imports)."""

from __future__ import annotations

from typing import Any


def enum_value(x: Any) -> str:
    """The string of a config value: an enum member's `.value`, anything else through str()."""
    return str(getattr(x, "value", x))
