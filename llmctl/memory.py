"""This process's resident memory: now, its peak, and the peak of one phase.

One meter for every report of host memory (`import hf`, `quantize`, the trainer on CPU), read
from /proc/self/status (Linux; 0 elsewhere).

Why VmHWM for the peak, not `getrusage().ru_maxrss`: Linux carries ru_maxrss across fork and
exec, so a process started by a large parent (a test runner, a notebook) reported the parent's
size as its own peak (seen: 2.35x the model instead of 1.3x). Neither can be reset, so the peak
of one phase of a process is sampled (`PeakRss`).
"""

from __future__ import annotations

import threading
from pathlib import Path


def _status_bytes(field: str) -> int:
    """A `/proc/self/status` memory field in bytes (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    """Current resident set size of this process."""
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process image (VmHWM; see the module docstring)."""
    return _status_bytes("VmHWM")


class PeakRss:
    """Context manager sampling this process's RSS; `peak_bytes` holds the maximum seen."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, rss_bytes())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self.peak_bytes = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak_bytes = max(self.peak_bytes, rss_bytes())
