"""Where configs/ and recipes/ live: the checkout, or the installed wheel.

From a checkout they sit at the repository root; a wheel carries them as
`llmctl/_resources/{configs,recipes}` (see pyproject's force-include). One function knows both.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the directory of `configs` or `recipes`, preferring the checkout."""
    for candidate in (_PACKAGE_DIR.parent / name, _PACKAGE_DIR / "_resources" / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"llmctl resource folder {name!r} not found near {_PACKAGE_DIR}")


def list_recipes() -> list[str]:
    """Names of the shipped recipes, sorted."""
    return sorted(p.stem for p in resource_dir("recipes").glob("*.yaml"))


def list_options(group: str) -> list[str]:
    """Names of the options of one config group, sorted."""
    return sorted(p.stem for p in (resource_dir("configs") / group).glob("*.yaml"))
