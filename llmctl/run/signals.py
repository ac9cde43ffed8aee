"""Signals around checkpointing: preemption notices, and helper processes that survive them.

Why this exists: launchers deliver a preemption notice (SIGTERM, SIGUSR1) to more than the
trainer. torchrun stops a worker with `killpg(SIGTERM)`, and SLURM signals every process of a
job step; both reach the helper processes megatron's checkpoint writer starts: a `spawn`
multiprocessing Manager (its results queue, cached for the whole run) and forked writers. If
they die of the notice, the checkpoint that the notice asks for fails (BrokenPipeError,
ConnectionRefusedError). So helpers are started with the notice signals blocked; they inherit
the mask and finish their write. One trap: Python's resource tracker, started on the first
`spawn`, *unblocks* SIGINT/SIGTERM in the parent after starting itself, so a Manager spawned
right after would inherit SIGTERM unblocked. `start_resource_tracker` starts it up front.

The other direction: a helper must not outlive its trainer (an orphaned Manager holds the
launcher's output pipe and leaks per restart). `die_with_parent` asks Linux to signal a
process when its parent dies (PR_SET_PDEATHSIG); the entry point applies it to ranks (parent:
torchrun), to the Manager and to forked writers (parent: the rank).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
log = logging.getLogger("llmctl.train.checkpoint")
_PR_SET_PDEATHSIG = 1


def preempt_exit_code(signum: int) -> int:
    """Exit code after a preemption checkpoint: 128 + signal, as if killed by the signal."""
    return 128 + int(signum)


@contextlib.contextmanager
def preempt_signals_deferred() -> Iterator[None]:
    """Block SIGTERM/SIGUSR1 here; they are delivered when the block ends, not lost.

    Processes started inside the block (megatron's Manager, forked writers) inherit the block
    and survive a preemption notice, so the checkpoint it asks for can still be written.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPT_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def block_preempt_signals() -> None:
    """Block the notice signals in this process for good (a forked writer finishing a save)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPT_SIGNALS)


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, outside any deferred-signal block.

    Its start unblocks SIGINT/SIGTERM in the calling process (CPython's `ensure_running`), which
    would undo `preempt_signals_deferred` for the Manager spawned next. The tracker itself
    ignores SIGINT and SIGTERM, and ends when the last process holding its pipe ends.
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def _prctl() -> Any:
    """libc's prctl, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(signum: int, parent_pid: int | None = None) -> bool:
    """Have Linux send `signum` to this process when its parent exits (PR_SET_PDEATHSIG).

    Args:
        signum: The signal to receive (SIGKILL for helpers, SIGTERM for ranks: a checkpoint).
        parent_pid: The parent expected now; if it is already gone, the signal is sent at once.

    Returns:
        Whether the request was registered (False off Linux or without libc).
    """
    prctl = _prctl()
    if prctl is None or prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)  # the parent died before the request was registered
    return True


def parent_death_signal(signum: int) -> Callable[[], None] | None:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `signum` when this process dies.

    libc is looked up here, in the parent, so the forked child only makes one system call.
    """
    prctl = _prctl()
    if prctl is None:
        return None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)

    return arm


class PreemptNotice:
    """SIGTERM/SIGUSR1 handlers that only note the notice; the loop acts on it after the step.

    Handlers are installed from the main thread only (Python's rule) and given back by
    `restore`, which matters when training runs inside a longer-lived process.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        """Install the handlers (a no-op off the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in PREEMPT_SIGNALS:
            self._old[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Give the signals back to their previous handlers."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.signum is None:
            log.warning("received %s: checkpointing after this step", signal.Signals(signum).name)
        self.signum = signum
