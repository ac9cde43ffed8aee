from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from llmctl import __version__
from llmctl.cli.main import app

runner = CliRunner()


def _llmctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmctl", *args], capture_output=True, text=True, timeout=60
    )


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_help_and_import_do_not_load_heavy_modules() -> None:
    code = (
        "import sys, llmctl, llmctl.config, llmctl.cli.main as m\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(m.app, ['--help']); assert r.exit_code == 0, r.output\n"
        "for row in m.COMMANDS:\n"
        "    r = CliRunner().invoke(m.app, [row.name, '--help'])\n"
        "    assert r.exit_code == 0 and row.help.split()[0] in r.output, (row.name, r.output)\n"
        "heavy = [k for k in sys.modules if k.split('.')[0] in "
        "('torch', 'megatron', 'transformer_engine', 'transformers', 'llmcompressor', 'numpy')]\n"
        "print(sorted(set(k.split('.')[0] for k in heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_recipes_list_and_show() -> None:
    listed = runner.invoke(app, ["recipes", "list", "--json"])
    assert listed.exit_code == 0 and "tiny_cpu" in listed.output
    shown = runner.invoke(app, ["recipes", "show", "tiny_cpu", "train.lr=0.5"])
    assert shown.exit_code == 0
    assert "Peak learning rate." in shown.output and "0.5" in shown.output


def test_user_error_is_one_line_exit_2() -> None:
    out = _llmctl("recipes", "show", "tiny_cpu", "train.lrr=1")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "did you mean train.lr" in out.stderr
    assert "Traceback" not in out.stderr
