"""The hang watchdog of one rank: a thread that ends a job making no step progress.

Rules (timeout, heartbeats, whom to blame) are pure, in `llmctl.run.hang`. This module does the
acting. The training loop calls `beat()` twice per step (a float and an int stored: nothing
else happens on the training thread); the watchdog thread wakes every heartbeat interval,
writes this rank's heartbeat and compares the time since the last beat with the timeout.

When it fires, it writes stacks under RUN_DIR/hangs/<attempt>/ (torchrun's run id and restart
count: the same on every rank of one start), one file per rank:

- its own rank's: `faulthandler.dump_traceback(all_threads=True)` from the watchdog thread;
- every other rank on this host (pids from their heartbeats): each rank registered
  `faulthandler` on SIGUSR2 at start (a C-level handler: it runs even while the main thread is
  blocked inside a gloo/NCCL call), writing into RUN_DIR/logs/rank<R>.stacks; the watchdog
  sends SIGUSR2 and copies what it wrote. A rank in state T (SIGSTOP, Ctrl-Z) cannot run its
  handler, so it first gets SIGCONT: its file says `state at detection: T (stopped)` and then
  shows where it was stopped. The job ends right after anyway.
- ranks on other hosts are dumped by the watchdogs of their own hosts (which fire as well,
  since every rank waits); a host with no live rank left leaves no file, and the event names
  those ranks (their heartbeats went stale).

Then it appends a `hang` event to RUN_DIR/health.jsonl, logs the line, prints the rank's exit
line (`llmctl: rank R exits 75: ...`, read by the launchers) and ends the process with
`EXIT_HANG` (os._exit: the main thread is stuck and cannot be interrupted). torchrun then stops
the other ranks; a restart (torchrun `--max-restarts`, SLURM requeue, `llmctl resume`)
continues from the newest committed checkpoint.

Off with `train.health.watchdog=false`. It watches the training loop only: checkpoint loading
before the first step and the final save after the last one are not timed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from llmctl.run import hang
from llmctl.run.health import EXIT_HANG, HANGS_DIR, append_event

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan import PlanRecord

log = logging.getLogger("llmctl.train.health")
DUMP_SIGNAL = signal.SIGUSR2
DUMP_WAIT_S = 3.0  # how long a peer's SIGUSR2 dump may take to appear


class Watchdog:
    """Hang watchdog of one rank (see the module docstring).

    Args:
        cfg: The resolved config (`train.health`, `train.eval_iters`).
        run_dir: The run directory.
        rank: This rank; `world`: the number of ranks (whose heartbeats are read).
        plan: The run's plan: its predicted step time scales the timeout.
    """

    def __init__(
        self, cfg: RootConfig, run_dir: Path, rank: int, world: int, plan: PlanRecord | None
    ) -> None:
        h = cfg.train.health
        self.factor, self.floor_s = h.hang_factor, h.hang_floor_s
        self.run_dir, self.rank, self.world = Path(run_dir), rank, world
        self.predicted_s = plan.step_time_s if plan is not None else None
        self.eval_interval, self.eval_iters = cfg.train.eval_interval, cfg.train.eval_iters
        self.last_step = cfg.train.train_iters
        self.host = socket.gethostname()
        self.interval_s = hang.heartbeat_interval_s(self.floor_s)
        self.step_times: deque[float] = deque(maxlen=64)
        self.step = 0
        self.units = 1.0
        self.last_beat = time.monotonic()
        self.last_beat_unix = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks: IO[str] | None = None

    # ----- training thread -----
    def beat(self, step: int, units: float = 1.0, step_s: float | None = None) -> None:
        """Progress: `step` reached; the next span may take `units` step-lengths."""
        if step_s is not None:
            self.step_times.append(step_s)
        self.step, self.units = step, units
        self.last_beat, self.last_beat_unix = time.monotonic(), time.time()

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """A span not timed (a rollback's checkpoint reload); progress is marked after it."""
        self.beat(self.step, math.inf)
        try:
            yield
        finally:
            self.beat(self.step)

    def units_after(self, step: int) -> float:
        """Step-lengths the span after `step` may take: 1, plus eval_iters before validation."""
        due = self.eval_interval > 0 and (step % self.eval_interval == 0 or step == self.last_step)
        return 1.0 + (self.eval_iters if due else 0)

    def start(self) -> Watchdog:
        """Register the SIGUSR2 stack dump and start the thread."""
        logs = self.run_dir / "logs"
        try:  # a full or read-only disk costs the dumps and heartbeats, not the run
            (self.run_dir / hang.HEARTBEAT_DIR).mkdir(parents=True, exist_ok=True)
            self._stacks = open(logs / f"rank{self.rank}.stacks", "a")  # noqa: SIM115 - kept open
            faulthandler.register(DUMP_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        except OSError as e:
            log.warning("hang watchdog: cannot write in %s (%s); no stack dumps asked", logs, e)
        self.beat(self.step)
        self._thread = threading.Thread(target=self._run, name="llmctl-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and unregister the dump signal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        with contextlib.suppress(ValueError, RuntimeError):
            faulthandler.unregister(DUMP_SIGNAL)
        if self._stacks is not None:
            self._stacks.close()

    def timeout_s(self) -> float:
        """The hang timeout of the current span (`hang.hang_timeout_s`)."""
        ref = hang.reference_step_s(self.predicted_s, list(self.step_times))
        return hang.hang_timeout_s(ref, self.factor, self.floor_s, self.units)

    # ----- watchdog thread -----
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write_heartbeat()
            waited = time.monotonic() - self.last_beat
            if waited > self.timeout_s():
                self._fire(waited)

    def _write_heartbeat(self) -> None:
        beat = hang.Heartbeat(
            rank=self.rank, host=self.host, pid=os.getpid(), step=self.step,
            progress_unix=self.last_beat_unix, written_unix=time.time(),
        )  # fmt: skip
        with contextlib.suppress(OSError):
            hang.write_heartbeat(self.run_dir, beat)

    def _fire(self, waited_s: float) -> None:
        try:
            line, event = self._dump_and_describe(waited_s)
            append_event(self.run_dir, event)
            log.error("hang: %s (timeout %.0f s)", line, self.timeout_s())
        except Exception as e:  # whatever happens, the job must end
            line = f"rank {self.rank} made no progress for {waited_s:.0f}s ({e})"
        print(f"llmctl: rank {self.rank} exits {EXIT_HANG}: {line}", file=sys.stderr, flush=True)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(EXIT_HANG)

    def _dump_and_describe(self, waited_s: float) -> tuple[str, dict[str, Any]]:
        detected = time.time()
        ranks = range(self.world)
        before = hang.read_heartbeats(self.run_dir, ranks)
        out = self.run_dir / HANGS_DIR / _attempt_id()  # one hang per attempt: it ends it
        out.mkdir(parents=True, exist_ok=True)
        self._dump_own(out, waited_s)
        for _ in range(hang.STALE_INTERVALS):  # whose heartbeat still advances?
            time.sleep(self.interval_s)
            self._write_heartbeat()
        beats = hang.read_heartbeats(self.run_dir, ranks)
        peers = [b for b in beats if b.host == self.host and b.rank != self.rank]
        states = {b.rank: _proc_state(b.pid) for b in peers}
        stopped = [r for r, st in states.items() if st.startswith("T")]
        stuck = sorted(set(hang.unresponsive(before, beats)) | set(stopped))
        blamed = hang.culprits(beats, stuck)
        self._dump_peers(out, peers, states)
        line = hang.hang_line(blamed, waited_s, out)
        event = {
            "event": "hang", "rank": self.rank, "host": self.host, "step": self.step,
            "detected_unix": round(detected, 3), "waited_s": round(waited_s, 2),
            "timeout_s": round(self.timeout_s(), 2),
            "blamed": [{"rank": b.rank, "host": b.host, "step": b.step} for b in blamed],
            "peer_states": states, "stacks": str(out), "line": line,
        }  # fmt: skip
        return line, event

    def _dump_own(self, out: Path, waited_s: float) -> None:
        path = out / f"rank{self.rank}.txt"
        with contextlib.suppress(FileExistsError), open(path, "x") as f:
            f.write(f"rank {self.rank} pid {os.getpid()} on {self.host}: step {self.step}, "
                    f"no progress for {waited_s:.1f} s (dumped by its own watchdog)\n")  # fmt: skip
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)

    def _dump_peers(self, out: Path, peers: list[hang.Heartbeat], states: dict[int, str]) -> None:
        """SIGUSR2 (and SIGCONT to a stopped one) to each local peer not yet dumped; copy."""
        asked: list[tuple[hang.Heartbeat, Path, int, IO[str]]] = []
        for b in peers:
            stacks = self.run_dir / "logs" / f"rank{b.rank}.stacks"
            try:
                f: IO[str] = open(out / f"rank{b.rank}.txt", "x")  # noqa: SIM115 - closed below
            except FileExistsError:
                continue  # another rank of this host already dumps it
            size = stacks.stat().st_size if stacks.exists() else 0
            f.write(
                f"rank {b.rank} pid {b.pid} on {b.host}: heartbeat step {b.step}; state at "
                f"detection: {states[b.rank]} (dumped on SIGUSR2 sent by rank {self.rank})\n"
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(b.pid, DUMP_SIGNAL)
                if states[b.rank].startswith("T"):
                    os.kill(b.pid, signal.SIGCONT)  # a stopped process runs no handler
            asked.append((b, stacks, size, f))
        deadline = time.monotonic() + DUMP_WAIT_S
        for _b, stacks, size, f in asked:
            text = _wait_growth(stacks, size, deadline)
            f.write(text or "(no stack dump appeared: the process did not run its handler)\n")
            f.close()


def _attempt_id() -> str:
    """The same on every rank of one (re)start: torchrun's run id and restart count."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        return f"{run_id[:12]}-r{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"pid{os.getpid()}"


def _proc_state(pid: int) -> str:
    """`R (running)`, `T (stopped)`, ... from /proc/PID/stat, or `gone`."""
    names = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped",
             "t": "tracing stop", "Z": "zombie"}  # fmt: skip
    try:
        code = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return f"{code} ({names.get(code, '?')})"


def _wait_growth(path: Path, size: int, deadline: float) -> str:
    """What was appended to `path` past `size`, once it stops growing (or at `deadline`)."""
    last = -1
    while time.monotonic() < deadline:
        now = path.stat().st_size if path.exists() else 0
        if now > size and now == last:
            break
        last = now
        time.sleep(0.2)
    try:
        with open(path, "rb") as f:
            f.seek(size)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class _Off:
    """`train.health.watchdog=false`: the loop's calls do nothing."""

    def beat(self, step: int, units: float = 1.0, step_s: float | None = None) -> None:
        """Nothing to note."""

    def units_after(self, step: int) -> float:
        """Unused."""
        return 1.0

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Nothing to pause."""
        yield

    def stop(self) -> None:
        """Nothing to stop."""


def start_watchdog(
    cfg: RootConfig, run_dir: Path, rank: int, world: int, plan: PlanRecord | None
) -> Watchdog | _Off:
    """The rank's watchdog, started; a no-op stand-in when `train.health.watchdog` is off."""
    if not cfg.train.health.watchdog:
        return _Off()
    return Watchdog(cfg, run_dir, rank, world, plan).start()
