"""Hostile values survive the shell unchanged and run nothing: checked by executing the
rendered text with the real bash."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmctl.launch.hostfile import parse_hostfile
from llmctl.launch.slurm import render_sbatch
from llmctl.launch.torchrun import render_torchrun_nodes


def _hostile(tmp_path: Path) -> dict[str, str]:
    return {
        "QUOTE": "x'; touch " + str(tmp_path / "pwned1") + "; echo '",
        "SUBST": "$(touch " + str(tmp_path / "pwned2") + ")",
        "TICKS": "`touch " + str(tmp_path / "pwned3") + '` "dq" \\ * ?',
    }


def test_sbatch_is_valid_bash_and_exports_values_verbatim(make_cfg: Callable[..., Any],
                                                          tmp_path: Path) -> None:  # fmt: skip
    env = _hostile(tmp_path)
    run_dir = tmp_path / "run $HOME dir"
    script = render_sbatch(make_cfg("parallel.dp=2", env=env), run_dir)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    exports = [line for line in script.splitlines() if line.startswith(("export ", "cd "))]
    run_dir.mkdir()
    probe = "\n".join([*exports, 'printf "%s\\0" "$PWD" "$QUOTE" "$SUBST" "$TICKS"'])
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split("\0")[:4] == [str(run_dir), env["QUOTE"], env["SUBST"], env["TICKS"]]
    assert not list(tmp_path.glob("pwned*"))


def test_remote_command_passes_env_inline_and_secrets_on_stdin(
    make_cfg: Callable[..., Any], tmp_path: Path
) -> None:
    fake_python = tmp_path / "py"  # stands in for the interpreter: prints what it was given
    fake_python.write_text('#!/bin/sh\nprintf "%s\\0" "$PWD" "$QUOTE" "$SUBST" "$TOKEN" "$@"\n')
    fake_python.chmod(0o755)
    env = _hostile(tmp_path)
    run_dir = tmp_path / "run dir;x"
    run_dir.mkdir()
    cfg = make_cfg("parallel.dp=2", env=env, secrets=["TOKEN"], python=str(fake_python))
    (node,) = render_torchrun_nodes(cfg, run_dir, parse_hostfile("h0\n"))
    clean = {k: v for k, v in os.environ.items() if k != "TOKEN"}
    out = subprocess.run(["bash", "-c", node.remote_command], input="s3cr3t $(x)\n",
                         capture_output=True, text=True, check=True, env=clean)  # fmt: skip
    fields = out.stdout.split("\0")
    assert fields[:4] == [str(run_dir), env["QUOTE"], env["SUBST"], "s3cr3t $(x)"]
    # the node wrapper (rank exit codes, leftovers, stdin watch), then torchrun itself
    assert fields[4:9] == ["-m", "llmctl.launch.node", "run", "--watch-stdin", "--"]
    assert fields[9:13] == [str(fake_python), "-m", "torch.distributed.run", "--nnodes=1"]
    assert fields[-4:-1] == ["-m", "llmctl.train.entry", str(run_dir)]
    assert "s3cr3t" not in node.remote_command
    assert not list(tmp_path.glob("pwned*"))
