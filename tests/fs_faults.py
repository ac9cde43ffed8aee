"""Filesystem faults the storage tests make (shared by unit and integration tests)."""

from __future__ import annotations

import errno
from pathlib import Path


def fill(mnt: Path) -> None:
    """Write `mnt/filler` until the filesystem refuses (ENOSPC), in ever smaller pieces, to the
    last byte."""
    with open(mnt / "filler", "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
