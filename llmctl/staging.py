"""Outputs written beside their final name, then moved into place in one rename.

A reader never sees a half-written output under its final name: commands write into a hidden
sibling folder and publish it only when complete (replacing an earlier output only then, after
the caller has checked it is llmctl's own and `--force` was given).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def staging_dir(out: Path) -> Path:
    """A new hidden sibling of `out` to write into (mode 0755 under the usual umask)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o777 & ~umask)
    return path


def publish(staging: Path, out: Path) -> None:
    """Move the finished `staging` folder to `out`, replacing what is there only now."""
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    staging.rename(out)
