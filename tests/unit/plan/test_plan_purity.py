"""`llmctl.plan` is pure: it imports only the standard library and itself (STYLE rule 1)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import llmctl.plan

PLAN_DIR = Path(llmctl.plan.__file__).parent


def test_plan_imports_only_stdlib_and_itself() -> None:
    for path in sorted(PLAN_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                ok = top in sys.stdlib_module_names or name.startswith("llmctl.plan")
                assert ok, f"{path.name} imports {name}"
