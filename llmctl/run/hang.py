"""Pure rules of the hang watchdog (`llmctl.train.watchdog`): timeout, heartbeats, culprit.

Why these rules: a rank that stops making progress (a deadlocked collective, a stopped or
swapped-out process, a dead NIC) keeps the whole job alive until the collective's own timeout
(10 to 30 minutes) and leaves no stack trace. The watchdog calls a rank hung when no step
progress was seen for

    timeout = max(hang_factor x step_s x units, hang_floor_s)

where `step_s` is the larger of the plan's predicted step time and the median measured step
time (steps after the first `WARMUP_STEPS`; a plan that underestimates must not cause false
alarms), `units` is how many step-lengths the current span may take (1 for a training step,
1 + eval_iters when a validation pass follows), and before either is known only the floor
applies.

Every rank's watchdog thread writes a heartbeat (rank, host, pid, last step, when that step
ended, when the heartbeat was written) to RUN_DIR/logs/heartbeats/rank<R>.json every
`heartbeat_interval_s`. When the watchdog fires it reads them twice, `STALE_INTERVALS`
intervals apart (writing its own meanwhile): a rank whose heartbeat did not advance cannot
run code at all (SIGSTOP, a dead host, the GIL held forever) and is named first, as is a rank
of this host in state T; else the rank(s) at the lowest step (behind the others); else every
rank (all wait in the same place).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

WARMUP_STEPS = 2
STALE_INTERVALS = 3
HEARTBEAT_DIR = "logs/heartbeats"


def reference_step_s(predicted_s: float | None, measured: Sequence[float]) -> float | None:
    """The step time the timeout scales: max(plan's prediction, median measured after warmup)."""
    steady = list(measured[WARMUP_STEPS:]) if len(measured) > WARMUP_STEPS else []
    known = [x for x in (predicted_s, statistics.median(steady) if steady else None) if x]
    return max(known) if known else None


def hang_timeout_s(
    step_s: float | None, factor: float, floor_s: float, units: float = 1.0
) -> float:
    """max(factor x step_s x units, floor_s); the floor alone while no step time is known;
    infinite for an untimed span (units = inf)."""
    if math.isinf(units):
        return math.inf
    if step_s is None or step_s <= 0:
        return floor_s
    return max(factor * step_s * units, floor_s)


def heartbeat_interval_s(floor_s: float) -> float:
    """How often heartbeats are written: a tenth of the floor, between 0.5 and 5 s."""
    return min(5.0, max(0.5, floor_s / 10))


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """What one rank's watchdog last wrote."""

    rank: int
    host: str
    pid: int
    step: int
    progress_unix: float
    """Wall-clock time of this rank's last step progress."""
    written_unix: float
    """Wall-clock time this heartbeat was written (the watchdog thread was alive then)."""


def heartbeat_path(run_dir: str | Path, rank: int) -> Path:
    """RUN_DIR/logs/heartbeats/rank<R>.json."""
    return Path(run_dir) / HEARTBEAT_DIR / f"rank{rank}.json"


def write_heartbeat(run_dir: str | Path, beat: Heartbeat) -> None:
    """Replace this rank's heartbeat atomically (readers never see half a file)."""
    path = heartbeat_path(run_dir, beat.rank)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(beat)))
    os.replace(tmp, path)


def read_heartbeats(run_dir: str | Path, ranks: Iterable[int]) -> list[Heartbeat]:
    """The heartbeats of `ranks` that exist and parse."""
    out = []
    for rank in ranks:
        try:
            out.append(Heartbeat(**json.loads(heartbeat_path(run_dir, rank).read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out


def unresponsive(before: Sequence[Heartbeat], after: Sequence[Heartbeat]) -> list[int]:
    """Ranks whose heartbeat did not advance between two reads (or vanished): their watchdog
    thread could not run (SIGSTOP, a dead host, the GIL held forever)."""
    later = {b.rank: b.written_unix for b in after}
    return [b.rank for b in before if later.get(b.rank, b.written_unix) <= b.written_unix]


def culprits(beats: Sequence[Heartbeat], stuck: Iterable[int]) -> list[Heartbeat]:
    """The ranks to blame: the `stuck` ones (unresponsive or stopped), else the ranks at the
    lowest step when others are further on, else all of them (all wait in one place)."""
    stuck_set = set(stuck)
    if stuck_set:
        return [b for b in beats if b.rank in stuck_set]
    if not beats:
        return []
    low = min(b.step for b in beats)
    behind = [b for b in beats if b.step == low]
    return behind if len(behind) < len(beats) else list(beats)


def hang_line(blamed: Sequence[Heartbeat], waited_s: float, stacks_dir: str | Path) -> str:
    """`rank R on HOST made no progress for Ns; stacks in DIR/` (one line for the launcher).

    N is the detecting rank's time without progress when the timeout tripped (the blamed
    rank's own heartbeat may be up to one interval older than its last step).
    """
    if blamed:
        who = ", ".join(f"rank {b.rank} on {b.host}" for b in blamed[:4])
        who += f" (+{len(blamed) - 4} more)" if len(blamed) > 4 else ""
    else:
        who = "this rank"
    return f"{who} made no progress for {waited_s:.0f}s; stacks in {stacks_dir}/"
