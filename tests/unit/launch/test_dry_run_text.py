"""`llmctl train|resume --dry-run` text: commands and sbatch printed verbatim, at any width.

Oracles outside llmctl: `bash -n` parses what a user would copy, `shlex.split` must give back
the exact argv of the `--json` form, and the real local SLURM controller accepts the printed
sbatch script (`sbatch --test-only`, which submits nothing).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app

RUN = "/tmp/llmctl-golden/run"  # never created: dry runs write nothing
PINNED = ["launcher.python=/opt/venv/bin/python", f"train.run_dir={RUN}"]
NARROW = {"COLUMNS": "40", "LINES": "20", "TERM": "xterm-256color"}


def _dry_run(*args: str, as_json: bool = False) -> str:
    runner = CliRunner()
    res = runner.invoke(
        app, ["train", "recipe=tiny_cpu", *PINNED, *args, "--dry-run", *(["--json"] * as_json)],
        env=NARROW,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return res.output


def _section(text: str, name: str) -> str:
    """The lines between `# --- NAME ---` and the next section header."""
    lines = text.splitlines(keepends=True)
    start = lines.index(f"# --- {name} ---\n") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("# --- "))
    return "".join(lines[start:end])


def _bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "captured.sh"
    path.write_text(script)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_local_text_is_golden_and_runs_as_shell(
    golden: Callable[[str, str], None], tmp_path: Path
) -> None:
    text = _dry_run("--dp", "2")
    head = text[: text.index("# --- resolved config ---\n")]
    golden("dry_run_local_dp2.txt", head)
    command = _section(text, "command")
    assert command.count("\n") == 1  # one line, however narrow the terminal
    _bash_n(command, tmp_path)
    described = json.loads(_dry_run("--dp", "2", as_json=True))
    env = [f"{k}={v}" for k, v in described["env"].items()]
    assert shlex.split(command) == ["env", *env, *described["command"]]


def test_sbatch_section_is_the_script_byte_for_byte(tmp_path: Path) -> None:
    text = _dry_run("launcher=slurm", "--dp", "2")
    sbatch = _section(text, "sbatch script")
    described = json.loads(_dry_run("launcher=slurm", "--dp", "2", as_json=True))
    assert sbatch == described["sbatch"].rstrip("\n") + "\n"
    assert max(len(line) for line in sbatch.splitlines()) > 40  # would have been wrapped
    _bash_n(sbatch, tmp_path)
    config = _section(text + "# --- end ---\n", "resolved config")
    assert "interval: 5" in config  # a requeueable job checkpoints (train_iters 50 // 10)


def test_ssh_lines_are_the_json_argv(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("h0\nh1\n")
    args = ("launcher=torchrun", f"launcher.hostfile={hosts}", "--nodes", "2", "--dp", "2")
    text = _dry_run(*args)
    described = json.loads(_dry_run(*args, as_json=True))
    for node in described["nodes"]:
        line = _section(text, f"node {node['node_rank']} on {node['host']}")
        assert line.count("\n") == 1
        _bash_n(line, tmp_path)
        assert shlex.split(line) == node["ssh"]


@pytest.mark.slurm
def test_real_slurm_accepts_the_printed_script(tmp_path: Path) -> None:
    conf = os.environ.get("SLURM_CONF") or "/tmp/llmctl-slurm/etc/slurm.conf"
    if shutil.which("sbatch") is None or not Path(conf).is_file():
        pytest.skip("no local SLURM cluster (scripts/slurm_local.sh up)")
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["train", "recipe=tiny_cpu", "launcher=slurm", f"train.run_dir={run_dir}",
              "--dp", "2", "--dry-run"], env=NARROW,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    script = tmp_path / "captured.sbatch"
    script.write_text(_section(res.output, "sbatch script"))
    run_dir.mkdir()  # --output must name a directory that exists; sbatch writes nothing here
    check = subprocess.run(
        ["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "SLURM_CONF": conf},
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "to start at" in check.stderr
