"""Progress of long calls, and keeping third-party chatter off the user's console.

Two reporters live here. Library functions take a `Progress` and announce phases
(`with progress.phase("export", 40) as p: ... p.advance()`); the default does nothing, the CLI
renders each phase as a bar with an ETA on stderr (`llmctl.cli.common.console_progress`), so
`--json` stdout stays clean.

Why fd-level redirection: libraries write warnings and progress bars to stderr in ways no
setting reaches (compressed-tensors passes tqdm's `disable=` explicitly, so `TQDM_DISABLE`
cannot silence it; torch and transformers emit warnings at import or call time). While a heavy
phase runs, `third_party_output_to(log)` points file descriptor 2 at a log file, so everything
written there lands in the log, while llmctl's own progress goes to a duplicate of the real
stderr. `-v` (`LLMCTL_VERBOSE=1`) leaves stderr alone.

The `llmctl data` commands report through a `ByteProgress`: the total is the input size in
bytes, known before work starts, so every line carries a percentage and an ETA (from the bytes
done in this run; chunks reused from an interrupted run count as done but not towards the
rate). On a terminal a rich bar redraws in place; otherwise (nohup, SLURM logs, CI) a plain
line is printed every `interval_s` seconds (10, or `$LLMCTL_PROGRESS_INTERVAL_S`) and once at
the end:

    preprocess: 41.3% 86.0/208.2 MB 12,345 docs 9.1 MB/s ETA 0:00:13
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO


def verbose() -> bool:
    """`llmctl -v`: show third-party warnings and progress bars on the console."""
    return bool(os.environ.get("LLMCTL_VERBOSE"))


class Phase:
    """One phase of a long call: `advance()` or `update(completed)`; no-op here."""

    def advance(self, n: int = 1) -> None:
        """Count `n` more units done."""

    def update(self, completed: int) -> None:
        """Set the units done."""


class Progress:
    """Phases of a long call; this base class renders nothing."""

    @contextlib.contextmanager
    def phase(self, name: str, total: int | None = None) -> Iterator[Phase]:
        """A phase of `total` units (None: unknown)."""
        yield Phase()


NO_PROGRESS = Progress()


@contextlib.contextmanager
def third_party_output_to(log_path: Path | None) -> Iterator[TextIO]:
    """Send everything written to stderr (fd 2) to `log_path` until the block ends.

    Yields:
        A stream on the real stderr, for llmctl's own progress. With `-v`, or when `log_path`
        is None, stderr is left alone and yielded as is.
    """
    if verbose() or log_path is None:
        yield sys.stderr
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    new_log = not log_path.exists()
    sys.stderr.flush()
    saved = os.dup(2)
    own = os.fdopen(os.dup(saved), "w", buffering=1)
    with open(log_path, "a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield own
        except BaseException:
            _drop_if_empty(log_path, new_log)
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            own.close()


def _drop_if_empty(log_path: Path, new_log: bool) -> None:
    """A failed block leaves no empty log behind (one it created: a user error found early)."""
    sys.stderr.flush()
    with contextlib.suppress(OSError):
        if new_log and log_path.stat().st_size == 0:
            log_path.unlink()


# ---------------------------------------------------------------- byte progress (data)


def _clock(seconds: float) -> str:
    s = max(int(seconds), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass(slots=True)
class ProgressLine:
    """Counts of one run and the line that describes them."""

    label: str
    total_bytes: int = 0
    done_bytes: int = 0
    resumed_bytes: int = 0
    docs: int = 0
    tokens: int | None = None
    started: float = field(default_factory=time.perf_counter)

    def text(self, now: float | None = None) -> str:
        """`label: P% done/total MB N docs R MB/s ETA h:mm:ss`."""
        elapsed = max((now or time.perf_counter()) - self.started, 1e-6)
        rate = (self.done_bytes - self.resumed_bytes) / elapsed
        pct = 100.0 * self.done_bytes / self.total_bytes if self.total_bytes else 0.0
        eta = (self.total_bytes - self.done_bytes) / rate if rate > 0 else None
        tok = f" {self.tokens / elapsed:,.0f} tok/s" if self.tokens is not None else ""
        return (
            f"{self.label}: {pct:.1f}% {self.done_bytes / 1e6:,.1f}/{self.total_bytes / 1e6:,.1f}"
            f" MB {self.docs:,} docs {rate / 1e6:,.1f} MB/s{tok}"
            f" ETA {_clock(eta) if eta is not None else '?'}"
        )


class ByteProgress:
    """Progress over a known number of input bytes (the `llmctl data` commands) on stderr:
    a bar on a terminal, plain periodic lines otherwise, nothing when disabled (`--json`
    output)."""

    def __init__(
        self,
        label: str,
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        interval_s: float | None = None,
        tty: bool | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        env = os.environ.get("LLMCTL_PROGRESS_INTERVAL_S")
        self.interval_s = interval_s if interval_s is not None else float(env or 10.0)
        self.line = ProgressLine(label)
        self._last = 0.0
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> ByteProgress:
        if self.enabled and self.tty:
            self._start_bar()
        return self

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        self._bar = Bar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
        )
        self._bar.start()
        self._task = self._bar.add_task(self.line.label, total=None, info="")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.enabled and exc[0] is None and self.line.total_bytes:
            print(self.line.text(), file=self.stream, flush=True)

    def update(
        self, *, total: int = 0, num_bytes: int = 0, docs: int = 0, tokens: int = 0,
        resumed: bool = False,
    ) -> None:  # fmt: skip
        """Add work done (or set the total)."""
        ln = self.line
        if total:
            ln.total_bytes = total
        ln.done_bytes += num_bytes
        ln.resumed_bytes += num_bytes if resumed else 0
        ln.docs += docs
        if tokens:
            ln.tokens = (ln.tokens or 0) + tokens
        if not self.enabled:
            return
        if self._bar is not None:
            info = ln.text().split(" MB ", 1)[-1].rsplit(" ETA", 1)[0]
            self._bar.update(self._task, total=ln.total_bytes or None, completed=ln.done_bytes,
                             info=info)  # fmt: skip
            return
        now = time.perf_counter()
        if now - self._last >= self.interval_s and ln.total_bytes:
            self._last = now
            print(ln.text(now), file=self.stream, flush=True)
