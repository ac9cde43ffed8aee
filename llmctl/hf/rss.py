"""This process's resident memory, from /proc/self/status (the import's peak-memory report)."""

from __future__ import annotations

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
    """Peak resident set size of this process image.

    VmHWM, not `getrusage().ru_maxrss`: Linux carries ru_maxrss across fork and exec, so a
    process started by a large parent (a test runner, a notebook) reported the parent's size as
    its own peak (seen: 2.35x the model instead of 1.3x).
    """
    return _status_bytes("VmHWM")
