"""`launcher=local`: torchrun on this node with the layout's world size.

`render_local`/`render_local_env` give the command and its environment (pure); `execute_local`
runs it, holding the run-directory lock for the run's lifetime. `LocalBackend` is this
launcher's `launch.backend.Backend`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.common import (
    RankExits,
    entry_args,
    launch_env,
    launch_shape,
    layout_of,
    python_of,
    tee,
    torchrun_prefix,
)
from llmctl.launch.procs import TOKEN_ENV, end_processes, new_token
from llmctl.run.lock import HELD_ENV

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.launch.backend import Backend, Outcome, Started, TrainLaunch
    from llmctl.launch.jobs import RunStatus
    from llmctl.plan import Layout
    from llmctl.run.lock import RunLock

LOG_FILE = "launcher.log"
"""The launcher's copy of the run's console output, under RUN_DIR/logs/."""


def render_local(cfg: RootConfig, run_dir: str | Path, layout: Layout | None = None) -> list[str]:
    """The torchrun command line of a one-node run (pure).

    Args:
        cfg: The resolved RootConfig.
        run_dir: The run directory the entry point reads its config from.
        layout: The resolved layout; None = the one the config alone implies.

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


def render_local_env(cfg: RootConfig, layout: Layout | None = None) -> dict[str, str]:
    """Environment added for a one-node run (pure)."""
    return launch_env(cfg, launch_shape(cfg, layout_of(cfg, layout), 1))


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """One copy-pasteable shell line: `env K=V ... argv` (what --dry-run prints)."""
    pairs = [f"{k}={v}" for k, v in env.items()]
    return shlex.join(["env", *pairs, *argv] if pairs else argv)


def execute_local(
    argv: list[str],
    env: dict[str, str],
    log_path: str | Path,
    echo: TextIO | None = None,
    *,
    lock_fd: int | None = None,
    exits: RankExits | None = None,
) -> int:
    """Run the rendered command, copying its output to `log_path` and to `echo` (stdout).

    The child sees LLMCTL_STDOUT_ISATTY=1 when the console is a terminal, so the entry point can
    keep its live panel although its own stdout is a pipe. Ctrl-C reaches torchrun too (same
    process group); SIGTERM to this process is passed on to torchrun (its workers checkpoint
    and exit); if this process dies, torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG).
    When torchrun has exited, any process of the run still alive (found by its run token,
    `procs.TOKEN_ENV`) is ended, so the call returns and nothing of the run is left.

    Args:
        argv: The rendered torchrun command.
        env: The rendered environment.
        log_path: The launcher log (appended).
        echo: Console stream (default stdout).
        lock_fd: The run-directory lock (`lock.acquire_run_lock`), handed to torchrun so the lock
            lives as long as torchrun does.
        exits: Collects the ranks' reported exit codes and reasons (`common.RankExits`).

    Returns:
        The exit code: a rank's own code when torchrun failed because a rank exited non-zero
        (torchrun itself exits 1), else torchrun's.
    """
    if not Path(argv[0]).exists():
        raise UserError(f"python {argv[0]} not found; set launcher.python to an interpreter path")
    echo = sys.stdout if echo is None else echo
    token = new_token()
    full_env = {**os.environ, **env, TOKEN_ENV: token}
    if lock_fd is not None:
        full_env[HELD_ENV] = "1"
    if echo.isatty():
        full_env["LLMCTL_STDOUT_ISATTY"] = "1"
    with contextlib.suppress(OSError):
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    proc = _spawn(argv, full_env, lock_fd)
    exits = RankExits() if exits is None else exits
    assert proc.stdout is not None
    copier = threading.Thread(target=tee, args=(proc.stdout, log_path, echo, exits), daemon=True)
    copier.start()
    rc = _wait_forwarding(proc)
    end_processes(token)
    copier.join(timeout=10)
    return exits.exit_code(rc)


def _spawn(argv: list[str], env: dict[str, str], lock_fd: int | None) -> subprocess.Popen[bytes]:
    """The one place this backend starts a process (torchrun)."""
    from llmctl.run.signals import parent_death_signal

    if lock_fd is not None:
        os.set_inheritable(lock_fd, True)
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=() if lock_fd is None else (lock_fd,),
        preexec_fn=parent_death_signal(signal.SIGTERM),  # torchrun ends with this process
    )


def _wait_forwarding(proc: subprocess.Popen[bytes]) -> int:
    """Wait for torchrun, passing SIGTERM on; Ctrl-C (already sent to it) gets 30 s."""

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, forward)
    try:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            try:
                return proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalCommand:
    """The rendering of a local launch: one torchrun command and its environment."""

    argv: tuple[str, ...]
    env: dict[str, str]

    def describe(self) -> dict[str, Any]:
        """`command` and `env` of the --dry-run --json view."""
        return {"command": list(self.argv), "env": self.env}

    def sections(self) -> list[tuple[str, str]]:
        """The command as one copy-pasteable shell line."""
        return [("command", shell_line(list(self.argv), self.env))]

    def recorded(self) -> dict[str, Any]:
        """launch.json keeps the command."""
        return {"command": list(self.argv)}


class LocalBackend:
    """`launcher=local`: torchrun on this node; this process waits for it and holds the lock."""

    holds_lock = True
    port_spread = 0

    def configure(self, cfg: RootConfig) -> RootConfig:
        """No defaults of its own."""
        return cfg

    def render(self, cfg: RootConfig, run_dir: Path, layout: Layout) -> LocalCommand:
        """`render_local` and `render_local_env`."""
        argv = render_local(cfg, run_dir, layout)
        return LocalCommand(argv=tuple(argv), env=render_local_env(cfg, layout))

    def check(self, launch: TrainLaunch) -> None:
        """Nothing to check before the run directory exists."""

    def execute(
        self, launch: TrainLaunch, *, echo: TextIO | None, lock: RunLock | None, started: Started
    ) -> Outcome:
        """Record the launch, then run torchrun to its end (`execute_local`)."""
        from llmctl.launch.backend import Outcome

        command = _command(launch)
        started({})
        exits = RankExits()
        log = launch.run_dir / "logs" / LOG_FILE
        lock_fd = None if lock is None else lock.fd
        rc = execute_local(list(command.argv), command.env, log, echo, lock_fd=lock_fd, exits=exits)
        return Outcome(exit_code=rc, reason=exits.reason())

    def status(self, run_dir: Path, record: dict[str, Any]) -> RunStatus:
        """From launch.json's exit code, else whether the launcher or its ranks live."""
        from llmctl.launch.jobs import status_from_record

        return status_from_record(run_dir, record)

    def log_path(self, run_dir: Path, record: dict[str, Any]) -> Path:
        """RUN_DIR/logs/launcher.log."""
        return run_dir / "logs" / LOG_FILE

    def cancel(self, run_dir: Path, record: dict[str, Any]) -> None:
        """SIGTERM to the launcher, which passes it on to torchrun (`execute_local`)."""
        from llmctl.launch.jobs import signal_launcher

        signal_launcher(run_dir, record)


def _command(launch: TrainLaunch) -> LocalCommand:
    if not isinstance(launch.rendering, LocalCommand):
        raise TypeError(f"launcher=local cannot run a {type(launch.rendering).__name__}")
    return launch.rendering


if TYPE_CHECKING:  # mypy checks that the class implements the launcher protocol
    _PROTOCOL: type[Backend] = LocalBackend
