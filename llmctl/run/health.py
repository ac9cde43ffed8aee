"""Health events of a run (hangs, divergence): their exit codes and RUN_DIR/health.jsonl.

Exit codes, chosen apart from the others llmctl uses (1 error, 2 bad input, 3 checkpoint saves
keep failing, 128+N preempted by signal N):

- `EXIT_DIVERGED` (4): the loss or grad norm diverged and the policy stopped the run (or the
  policy ran out of `train.health.max_divergences`). Resuming retrains from the newest
  checkpoint, which never holds the divergent update.
- `EXIT_HANG` (75, sysexits' EX_TEMPFAIL, "try again"): the watchdog saw no step progress for
  the hang timeout. The job is meant to be restarted (torchrun `--max-restarts`, SLURM requeue,
  `llmctl resume`), which continues from the newest committed checkpoint.

Every event is one JSON line in RUN_DIR/health.jsonl, appended by the rank that saw it (one
`write` of a short line with O_APPEND: lines of several ranks do not interleave).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EXIT_DIVERGED = 4
EXIT_HANG = 75
HEALTH_FILE = "health.jsonl"
HANGS_DIR = "hangs"


def append_event(run_dir: str | Path, event: dict[str, Any]) -> dict[str, Any]:
    """Append one event (with `time_unix` added) to RUN_DIR/health.jsonl; returns it.

    Never raises on I/O: a full disk loses the record, not the run (the log line stays).
    """
    record = {"time_unix": round(time.time(), 3), **event}
    line = (json.dumps(record, default=str) + "\n").encode()
    try:
        fd = os.open(Path(run_dir) / HEALTH_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass
    return record


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every whole record of RUN_DIR/health.jsonl, oldest first ([] when none)."""
    path = Path(run_dir) / HEALTH_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def last_hang_line(run_dir: str | Path) -> str | None:
    """The one-line explanation of the newest hang, for the launcher (None if none).

    Several ranks report one hang (each watchdog fires; a stopped rank woken to dump its stack
    fires too, blaming the rank that already left): the line is the first detection's of the
    newest incident (its stacks directory).
    """
    hangs = [e for e in read_events(run_dir) if e.get("event") == "hang" and e.get("line")]
    if not hangs:
        return None
    newest = [e for e in hangs if e.get("stacks") == hangs[-1].get("stacks")]
    first = min(newest, key=lambda e: float(e.get("detected_unix") or e.get("time_unix") or 0))
    return str(first["line"])
