"""The way to a launch is torch-free: `llmctl.run` and the whole `llmctl train --dry-run` path
import neither torch nor megatron-core (only the rank entry point does)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import llmctl.run

HEAVY = ("torch", "megatron", "transformer_engine", "transformers")

_CHECK = """
import sys
{body}
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
print("HEAVY=" + ",".join(heavy))
"""


def _heavy_after(body: str, cwd: str | None = None) -> list[str]:
    code = _CHECK.format(body=textwrap.dedent(body), heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=cwd
    )
    line = [x for x in done.stdout.splitlines() if x.startswith("HEAVY=")]
    assert line, f"the check did not finish: {done.stdout}\n{done.stderr}"
    return [x for x in line[-1].removeprefix("HEAVY=").split(",") if x]


def test_every_run_module_imports_without_torch() -> None:
    names = [f"llmctl.run.{m.name}" for m in pkgutil.iter_modules(llmctl.run.__path__)]
    assert len(names) >= 10, names
    body = "import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
    assert _heavy_after(body) == []


@pytest.mark.parametrize(
    "launcher", [[], ["launcher=slurm"], ["launcher=torchrun", "launcher.hostfile=hosts.txt"]]
)
def test_train_dry_run_loads_no_torch(tmp_path: Path, launcher: list[str]) -> None:
    (tmp_path / "hosts.txt").write_text("node01\nnode02\n")
    argv = ["llmctl", "train", "recipe=tiny_cpu", "--dp", "2", *launcher, "--dry-run"]
    body = f"""
    sys.argv = {argv!r}
    from llmctl.cli.main import main
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, exc.code
    """
    assert _heavy_after(body, cwd=str(tmp_path)) == []


def test_the_check_sees_torch() -> None:
    """The probe itself works: importing the rank side does load torch."""
    assert "torch" in _heavy_after("import llmctl.train.parallel\nimport torch")
