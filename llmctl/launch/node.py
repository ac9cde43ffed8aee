"""A launch under a remote launcher: `python -m llmctl.launch.node run [--watch-stdin] -- ARGV`.

torchrun exits 1 whatever its workers' codes. Under SLURM that 1 would be the job's exit code
(`scontrol`/`sacct` ExitCode 1:0), under ssh the node's. This wrapper does what `llmctl train`
does around the local launcher (`launch.local.execute_local`): it marks the run's processes with
a run token (`procs.TOKEN_ENV`), copies ARGV's output to its own while reading the ranks' exit
lines (`common.RankExits`), ends whatever of the run is left on this host once ARGV has exited
(`procs.end_processes`), and exits with the rank's own code: 3 for the failed-save policy stop,
143 after a preemption checkpoint. An ARGV killed by a signal with no rank report is passed on
as the same signal (ssh then reports 255: the ssh launcher's "node lost").

Two places:
- SLURM: around `srun` in the batch script (srun carries every node's output). Signals to the
  batch step reach srun too (slurmstepd signals the whole step), so SIGTERM/SIGINT/SIGUSR1 are
  only noted here: passing them on as well would make srun cancel the job step at once.
- ssh (`--watch-stdin`): around each node's torchrun. torchrun dies with the wrapper
  (PR_SET_PDEATHSIG), SIGTERM and SIGINT are passed on, and the run is stopped (SIGTERM to
  torchrun: the ranks checkpoint and exit) when standard input closes: the launcher closed it, or
  the launcher's ssh client died. sshd sends no signal to a command without a terminal, so
  without this a remote torchrun ran on after its launcher was killed.
- Kubernetes (`--forward-signals`): the container's command. The kubelet sends SIGTERM to PID 1
  only (this wrapper). SIGTERM goes to torchrun's workers themselves (torchrun would give them
  only 30 s before killing them, whatever the grace period), SIGINT to torchrun; torchrun dies
  with the wrapper; standard input is not watched.

`python -m llmctl.launch.node record RUN_DIR CODE` writes a SLURM job's exit code into the run's
launch record (the batch script calls it once srun has returned).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from llmctl.launch.common import RankExits, tee
from llmctl.launch.procs import TOKEN_ENV, end_processes, new_token

USAGE = (
    "usage: python -m llmctl.launch.node run [--watch-stdin | --forward-signals] -- ARGV...\n"
    "       python -m llmctl.launch.node record RUN_DIR CODE"
)


def run_node(
    argv: list[str],
    *,
    watch_stdin: bool = False,
    forward: bool | None = None,
    to_ranks: bool = False,
) -> int:
    """Run `argv` (srun, or one node's torchrun) to its end; return the code to exit with.

    Args:
        argv: The rendered command.
        watch_stdin: ssh: stop the run (SIGTERM to torchrun) when standard input closes, pass
            SIGTERM/SIGINT on, and let torchrun die with this process; else (srun) only note
            them.
        forward: pass SIGTERM/SIGINT on to torchrun and let it die with this process, without
            watching standard input (a Kubernetes pod: the kubelet signals PID 1 only); None =
            as `watch_stdin`.
        to_ranks: with `forward`, SIGTERM goes to torchrun's workers (the ranks) instead of
            torchrun, which would kill them 30 s later whatever their save needs; the ranks
            checkpoint within the pod's grace period, exit 143, and torchrun ends with them.

    Returns:
        A rank's reported non-zero code when one was reported, else torchrun's own code, or
        -N when torchrun was killed by signal N and no rank reported a code.
    """
    forward = watch_stdin if forward is None else forward
    token = new_token()
    proc = _spawn(argv, {**os.environ, TOKEN_ENV: token}, with_wrapper=forward)
    exits = RankExits()
    assert proc.stdout is not None
    copier = threading.Thread(target=tee, args=(proc.stdout, None, sys.stdout, exits), daemon=True)
    copier.start()
    if watch_stdin:
        threading.Thread(target=_stop_on_eof, args=(proc,), daemon=True).start()
    old = _handle_signals(proc, forward=forward, to_ranks=to_ranks)
    try:
        rc = proc.wait()
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
    end_processes(token)  # what a crashed rank left (its Manager, writers): nothing else runs
    copier.join(timeout=10)
    if rc < 0 and not any(code for _, code, _ in exits.reports):
        return rc
    return exits.exit_code(rc if rc >= 0 else 128 - rc)


def _spawn(argv: list[str], env: dict[str, str], *, with_wrapper: bool) -> subprocess.Popen[bytes]:
    """The one place this module starts a process (ARGV); `with_wrapper`: it gets SIGTERM
    when this process dies (not srun: SIGTERM makes srun cancel the step at once)."""
    from llmctl.run.signals import parent_death_signal

    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=parent_death_signal(signal.SIGTERM) if with_wrapper else None,
    )


def _handle_signals(
    proc: subprocess.Popen[bytes], *, forward: bool, to_ranks: bool = False
) -> dict[int, Any]:
    """Note (srun) or pass on (ssh, pods) SIGTERM/SIGINT/SIGUSR1; returns the old handlers."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        if not forward or signum == signal.SIGUSR1:
            return
        ranks = _children(proc.pid) if to_ranks and signum == signal.SIGTERM else []
        for pid in ranks or [proc.pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    return {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}


def _children(pid: int) -> list[int]:
    """The direct children of `pid` (torchrun's workers), from /proc; [] when unknown."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _stop_on_eof(proc: subprocess.Popen[bytes]) -> None:
    """Read standard input to its end; then stop torchrun (its ranks checkpoint and exit)."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(OSError, ValueError):  # the session may be gone: EPIPE
            print("llmctl: the launcher's ssh session closed; stopping this node", flush=True)


def record_exit(run_dir: str | Path, code: int) -> None:
    """Add a finished SLURM job's exit code to RUN_DIR/launch.json (`llmctl status` reads it)."""
    import time

    from llmctl.launch.api import exit_reason, read_launch, write_launch

    try:
        record = read_launch(run_dir)
    except (OSError, ValueError):
        record = {}
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    record.update(exit_code=code, finished=time.time(), slurm_restart=int(restarts or 0))
    if record.get("layout_changes"):
        from llmctl.launch.elastic import settle_seconds_lost

        settle_seconds_lost(Path(run_dir), record)
    reason = exit_reason(Path(run_dir), code, None)  # the hang line (launch.api.exit_reason)
    if reason:
        record["reason"] = reason
    write_launch(Path(run_dir), record)


def _exit(rc: int) -> int:
    """Exit with `rc`, or die of signal -rc (so ssh and srun see the signal, as before)."""
    if rc >= 0:
        return rc
    with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
        signal.signal(-rc, signal.SIG_DFL)
    os.kill(os.getpid(), -rc)
    return 128 - rc  # not reached for a fatal signal


def main(argv: list[str] | None = None) -> int:
    """Command line: `run [--watch-stdin] -- ARGV...` or `record RUN_DIR CODE`."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["record"] and len(args) == 3 and args[2].lstrip("-").isdigit():
        record_exit(args[1], int(args[2]))
        return 0
    if args[:1] == ["run"]:
        watch = "--watch-stdin" in args[1:2]
        forward = "--forward-signals" in args[1:2]
        rest = args[2:] if watch or forward else args[1:]
        if rest[:1] == ["--"] and len(rest) > 1:
            return _exit(
                run_node(rest[1:], watch_stdin=watch, forward=watch or forward, to_ranks=forward)
            )
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
