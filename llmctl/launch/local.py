"""`launcher=local`: torchrun on this node with the layout's world size."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.common import (
    entry_args,
    launch_env,
    launch_shape,
    layout_of,
    python_of,
    tee,
    torchrun_prefix,
)


def render_local(cfg: Any, run_dir: str | Path, layout: Any | None = None) -> list[str]:
    """The torchrun command line of a one-node run (pure).

    Args:
        cfg: The resolved RootConfig.
        run_dir: The run directory the entry point reads its config from.
        layout: The resolved TrainLayout; None = the one the config alone implies.

    Raises:
        UserError: The config asks for several nodes, or the layout and nproc disagree.
    """
    if cfg.cluster.num_nodes != 1:
        raise UserError(
            f"launcher=local starts processes on this node only, but cluster.num_nodes="
            f"{cfg.cluster.num_nodes}; use launcher=torchrun (hostfile) or launcher=slurm"
        )
    shape = launch_shape(cfg, layout_of(cfg, layout), 1)
    return [
        *torchrun_prefix(python_of(cfg)),
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={shape.nproc_per_node}",
        f"--max-restarts={cfg.launcher.max_restarts}",
        *entry_args(run_dir),
    ]


def render_local_env(cfg: Any, layout: Any | None = None) -> dict[str, str]:
    """Environment added for a one-node run (pure)."""
    return launch_env(cfg, launch_shape(cfg, layout_of(cfg, layout), 1))


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """One copy-pasteable shell line: `env K=V ... argv` (what --dry-run prints)."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    return shlex.join(["env", *pairs, *argv] if pairs else argv)


def execute_local(
    argv: list[str], env: dict[str, str], log_path: str | Path, echo: TextIO | None = None
) -> int:
    """Run the rendered command, copying its output to `log_path` and to `echo` (stdout).

    The child sees LLMCTL_STDOUT_ISATTY=1 when the console is a terminal, so the entry point can
    keep its live panel although its own stdout is a pipe. Ctrl-C reaches torchrun too (same
    process group); it is given 30 s to stop its workers.

    Returns:
        The torchrun exit code.
    """
    if not Path(argv[0]).exists():
        raise UserError(f"python {argv[0]} not found; set launcher.python to an interpreter path")
    echo = sys.stdout if echo is None else echo
    full_env = {**os.environ, **env}
    if echo.isatty():
        full_env["LLMCTL_STDOUT_ISATTY"] = "1"
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        tee(proc.stdout, log_path, echo)
        return proc.wait()
    except KeyboardInterrupt:
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
