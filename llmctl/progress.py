"""Progress of long library calls, and keeping third-party chatter off the user's console.

Library functions take a `Progress` and announce phases (`with progress.phase("export", 40) as
p: ... p.advance()`); the default does nothing, the CLI renders each phase as a bar with an ETA
on stderr (`llmctl.cli.common.console_progress`), so `--json` stdout stays clean.

Why fd-level redirection: libraries write warnings and progress bars to stderr in ways no
setting reaches (compressed-tensors passes tqdm's `disable=` explicitly, so `TQDM_DISABLE`
cannot silence it; torch and transformers emit warnings at import or call time). While a heavy
phase runs, `third_party_output_to(log)` points file descriptor 2 at a log file, so everything
written there lands in the log, while llmctl's own progress goes to a duplicate of the real
stderr. `-v` (`LLMCTL_VERBOSE=1`) leaves stderr alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


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
