"""Third-party output (warnings, bars written to stderr by any means) goes to the log file while
a long call runs; llmctl's own progress still reaches the real stderr; `-v` keeps it all.

Run in a child process: pytest replaces sys.stderr and the warning machinery, which is exactly
what this must not depend on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r"""
import os, sys, warnings
from pathlib import Path
from llmctl.progress import third_party_output_to
with third_party_output_to(Path(sys.argv[1])) as own:
    warnings.warn("library notice", UserWarning)
    os.write(2, b"\rCompressing model: 100%|##########| 7/7\n")  # a C-level or tqdm bar
    print("python-level bar", file=sys.stderr)
    own.write("llmctl phase 1/3\n")
    own.flush()
print("after", file=sys.stderr)
"""


def _run(tmp_path: Path, verbose: bool) -> tuple[str, Path]:
    env = {k: v for k, v in os.environ.items() if k != "LLMCTL_VERBOSE"}
    if verbose:
        env["LLMCTL_VERBOSE"] = "1"
    log = tmp_path / "out.log"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(log)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, log


def test_chatter_goes_to_the_log(tmp_path: Path) -> None:
    err, log = _run(tmp_path, verbose=False)
    assert err == "llmctl phase 1/3\nafter\n"
    text = log.read_text()
    assert "library notice" in text and "Compressing model" in text and "python-level" in text


def test_verbose_keeps_it_on_the_console(tmp_path: Path) -> None:
    err, log = _run(tmp_path, verbose=True)
    assert "library notice" in err and "Compressing model" in err and "python-level" in err
    assert not log.exists()


def test_dash_v_turns_verbose_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmctl -v CMD` is what sets LLMCTL_VERBOSE for the library (and the ranks it starts)."""
    from typer.testing import CliRunner

    from llmctl.cli.main import app

    monkeypatch.setenv("LLMCTL_VERBOSE", "")  # recorded, so restored after `-v` sets it
    assert CliRunner().invoke(app, ["recipes", "list", "--json"]).exit_code == 0
    assert not os.environ.get("LLMCTL_VERBOSE")
    assert CliRunner().invoke(app, ["-v", "recipes", "list", "--json"]).exit_code == 0
    assert os.environ.get("LLMCTL_VERBOSE") == "1"
