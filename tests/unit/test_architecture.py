"""The package graph of llmctl (docs/architecture.md): every import, those inside functions
included, goes to a lower room; so there is no cycle and no upward arrow.

The layers, lowest first. A package may import its own modules and any package of a lower
layer, nothing else. `train/` (the in-rank runner) is reached from launch only through a new
process (`python -m llmctl.train.entry`), never by import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "llmctl"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("progress", "staging", "resources", "memory", "sbatch"),
    ("plan",),
    ("data",),
    ("topology",),
    ("config",),
    ("run",),
    ("train",),
    ("hf",),
    ("quant",),
    ("eval",),
    ("launch",),
    ("plotting",),
    ("cli",),
    ("__main__",),
)
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
NEVER_IMPORT_TRAIN = (
    "run", "launch", "cli", "config", "topology", "plan", "data", "quant", "eval"
)  # fmt: skip


def _room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module(path: Path) -> list[str]:
    parts = ["llmctl", *path.relative_to(PACKAGE).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, llmctl module) for every import in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _module(path)
                base = base if path.name == "__init__.py" else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return [(line, name) for line, name in found if name.startswith("llmctl.")]


def _arrows() -> list[tuple[str, str, str]]:
    """(from room, to room, 'file:line -> module') for imports between rooms."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = _room(path)
        for line, name in _imports(path):
            dst = name.split(".")[1]
            if dst != src:
                out.append((src, dst, f"{path.relative_to(PACKAGE.parent)}:{line} -> {name}"))
    return out


ARROWS = _arrows()


def test_every_room_has_a_layer() -> None:
    rooms = {_room(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert rooms <= set(LAYER), f"rooms without a layer: {sorted(rooms - set(LAYER))}"
    assert len(ARROWS) > 50  # the walk sees imports inside functions too


def _not_down(arrows: list[tuple[str, str, str]]) -> list[str]:
    return [where for src, dst, where in arrows if dst != "__init__" and LAYER[dst] >= LAYER[src]]


def test_no_upward_or_sideways_arrow() -> None:
    bad = _not_down(ARROWS)
    assert not bad, "imports that go up or sideways:\n" + "\n".join(bad)


@pytest.mark.parametrize("room", NEVER_IMPORT_TRAIN)
def test_room_never_imports_the_runner(room: str) -> None:
    bad = [where for src, dst, where in ARROWS if src == room and dst == "train"]
    assert not bad, f"{room}/ imports llmctl.train:\n" + "\n".join(bad)


def test_the_check_sees_upward_and_sideways_arrows() -> None:
    """The rule is not vacuous: a planner importing the launcher, or data importing topology
    (same layer rule: lower only), is reported; the real graph's downward arrows are not."""
    fake = [("plan", "launch", "plan -> launch"), ("data", "topology", "data -> topology")]
    assert _not_down(fake) == ["plan -> launch", "data -> topology"]
    assert _not_down([a for a in ARROWS if a[0] == "cli"]) == []
