"""Straggler detection: which rank (and host) makes every other rank wait, window after window.

Why compute time and not step time: in synchronous data parallelism every rank's step lasts as
long as the slowest rank's, because the gradient all-reduce cannot finish before the last rank
joins it. What differs is how the step splits. A slow rank spends longer from the step's start
to the gradient reduction (its forward and backward, data loading included) and then waits
little in the reduction; a fast rank gets there early and waits. So each rank times its own
*compute* part, step start to the entry of the gradient reduction (`llmctl.train.straggler`),
and its *reduce* part (time inside the reduction: the waiting). Every `window_steps` steps the
ranks' window figures are gathered on rank 0, and a rank whose compute figure exceeds the
median of the other ranks it is compared with (its pipeline stage; for DP=2 the other rank) by
more than `margin` is slow in that window. `windows` slow windows in a row name it; as many
normal windows in a row clear it. A rank's compute figure of a window is the lower quartile of
its steps' compute times, not the mean or the median: a rank that is really slower is slow on
(nearly) every step, so even its faster steps are slow, while bursts of a neighbour on a shared
host, a page-cache miss or a collector pause stretch some steps only. On this 2-core host at a
load average of 10, one 600-step even DP=2 run had 21 of 120 rank-windows of 10 steps slow
by the median and 17 by the lower quartile at margin 0.25 (10 and 6 at margin 0.5); with 3
windows in a row, the median named a rank once, the lower quartile never (docs/monitoring.md).

Pure logic and the run directory's files (stragglers.json, excluded_hosts.json); torch-free.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STRAGGLERS_FILE = "stragglers.json"
EXCLUDED_HOSTS_FILE = "excluded_hosts.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankWindow:
    """One rank's medians over one window of steps."""

    rank: int
    host: str
    group: int
    """Ranks compared with each other (the pipeline stage: stages do different work)."""
    compute_s: float
    """Step start to the gradient reduction (forward, backward, data), seconds: the lower
    quartile of the window's steps (`window_figure`)."""
    reduce_s: float
    """Time inside the gradient reduction, seconds: what a fast rank spends waiting."""
    step_s: float
    """Wall time of the step, seconds (the same on every rank of a synchronous job)."""
    node_rank: int | None = None
    """torchrun's node (GROUP_RANK), which names the hostfile entry."""


def window_figure(compute_s: Sequence[float]) -> float:
    """A rank's compute figure of one window: the lower quartile of its steps' compute times
    (nearest rank; see the module docstring for why not the median)."""
    xs = sorted(compute_s)
    return xs[(len(xs) - 1) // 4]


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
    """A rank named slow: its compute time beside the median of the ranks it is compared with."""

    rank: int
    host: str
    compute_s: float
    median_s: float
    since_step: int
    windows: int
    node_rank: int | None = None

    @property
    def ratio(self) -> float:
        """Compute time / the others' median (1.5 = 50 % slower)."""
        return self.compute_s / self.median_s if self.median_s > 0 else float("inf")

    def line(self, window_steps: int) -> str:
        """The one log line that names it."""
        return (
            f"straggler: rank {self.rank} on host {self.host}: compute {self.compute_s:.3f} s "
            f"per step vs median {self.median_s:.3f} s of the other ranks "
            f"(+{(self.ratio - 1) * 100:.0f} %), {self.windows} windows of {window_steps} steps "
            f"in a row (from step {self.since_step})"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON form (with the ratio)."""
        return {**asdict(self), "ratio": self.ratio}


def slow_ranks(ranks: Sequence[RankWindow], margin: float) -> dict[int, tuple[float, float]]:
    """Ranks slower than the median of the others of their group by more than `margin`.

    Returns:
        rank -> (its compute seconds, the others' median compute seconds). A group of one
        rank has nothing to be compared with and names nobody.
    """
    out: dict[int, tuple[float, float]] = {}
    for group in {r.group for r in ranks}:
        members = [r for r in ranks if r.group == group]
        if len(members) < 2:
            continue
        for r in members:
            median = statistics.median(o.compute_s for o in members if o.rank != r.rank)
            if r.compute_s > (1.0 + margin) * median:
                out[r.rank] = (r.compute_s, median)
    return out


@dataclass(slots=True, kw_only=True)
class Verdict:
    """What one window changed."""

    slow: dict[int, tuple[float, float]]
    named: list[Straggler] = field(default_factory=list)
    """Newly named in this window."""
    cleared: list[Straggler] = field(default_factory=list)
    """Named before, normal for `windows` windows now."""


class StragglerDetector:
    """Counts slow and normal windows per rank; names and clears stragglers (rank 0)."""

    def __init__(self, *, margin: float, windows: int) -> None:
        self.margin, self.windows = margin, windows
        self.slow_streak: dict[int, int] = {}
        self.ok_streak: dict[int, int] = {}
        self.first_slow: dict[int, int] = {}
        self.current: dict[int, Straggler] = {}
        self.num_windows = 0
        self.num_slow: dict[int, int] = {}
        """Slow windows per rank (named or not): the false-positive count of an even run."""

    def observe(self, step: int, ranks: Sequence[RankWindow], *, first_step: int) -> Verdict:
        """Feed the window of steps `first_step`..`step`."""
        slow = slow_ranks(ranks, self.margin)
        verdict = Verdict(slow=slow)
        self.num_windows += 1
        for r in ranks:
            if r.rank in slow:
                self.num_slow[r.rank] = self.num_slow.get(r.rank, 0) + 1
                self.ok_streak[r.rank] = 0
                if not self.slow_streak.get(r.rank):
                    self.first_slow[r.rank] = first_step
                self.slow_streak[r.rank] = self.slow_streak.get(r.rank, 0) + 1
                compute, median = slow[r.rank]
                if r.rank not in self.current and self.slow_streak[r.rank] >= self.windows:
                    s = Straggler(
                        rank=r.rank, host=r.host, compute_s=compute, median_s=median,
                        since_step=self.first_slow[r.rank], windows=self.slow_streak[r.rank],
                        node_rank=r.node_rank,
                    )  # fmt: skip
                    self.current[r.rank] = s
                    verdict.named.append(s)
            else:
                self.slow_streak[r.rank] = 0
                self.ok_streak[r.rank] = self.ok_streak.get(r.rank, 0) + 1
                if r.rank in self.current and self.ok_streak[r.rank] >= self.windows:
                    verdict.cleared.append(self.current.pop(r.rank))
        return verdict


# ----- files of the run directory -----
def _write_json(path: Path, obj: Any) -> None:
    """Whole or not at all: a temporary file renamed over the old one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class StragglerLog:
    """RUN_DIR/stragglers.json: the settings, the stragglers named now, every naming and
    clearing (events), and the last window's per-rank medians. Rewritten whole each window."""

    def __init__(self, run_dir: Path, settings: dict[str, Any]) -> None:
        self.path = run_dir / STRAGGLERS_FILE
        old = _read_json(self.path)
        events = old.get("events") if isinstance(old, dict) else None
        self.events: list[dict[str, Any]] = events if isinstance(events, list) else []
        self.settings = settings

    def write(
        self, step: int, ranks: Sequence[RankWindow], verdict: Verdict, detector: StragglerDetector
    ) -> None:
        """Record the window that ended at `step` (an event for each naming and clearing)."""
        now = time.time()
        for kind, items in (("named", verdict.named), ("cleared", verdict.cleared)):
            self.events += [
                {"event": kind, "step": step, "time": now, **s.as_dict()} for s in items
            ]
        _write_json(
            self.path,
            {
                **self.settings,
                "step": step,
                "time": now,
                "current": [s.as_dict() for s in detector.current.values()],
                "num_windows": detector.num_windows,
                "num_slow_windows": {str(k): v for k, v in sorted(detector.num_slow.items())},
                "events": self.events,
                "last_window": [
                    {**asdict(r), "slow": r.rank in verdict.slow}
                    for r in sorted(ranks, key=lambda r: r.rank)
                ],
            },
        )


def read_stragglers(run_dir: Path) -> dict[str, Any] | None:
    """stragglers.json of a run directory (None when absent or unreadable)."""
    data = _read_json(run_dir / STRAGGLERS_FILE)
    return data if isinstance(data, dict) else None


def current_stragglers(run_dir: Path) -> list[dict[str, Any]]:
    """The stragglers named now (rank, host, compute_s, median_s, ratio, since_step)."""
    data = read_stragglers(run_dir) or {}
    current = data.get("current")
    return [s for s in current if isinstance(s, dict)] if isinstance(current, list) else []


def straggler_text(run_dir: Path) -> str | None:
    """`stragglers: rank 1 on node-2 (+71 %, since step 21)`, for `llmctl status`; None when
    nobody is named now."""
    named = current_stragglers(run_dir)
    if not named:
        return None
    parts = [
        f"rank {s.get('rank')} on {s.get('host')} (+{100 * (float(s.get('ratio', 1)) - 1):.0f} %, "
        f"since step {s.get('since_step')})"
        for s in named
    ]
    return "stragglers: " + ", ".join(parts)


# ----- the exclude policy -----
def record_excluded_host(run_dir: Path, straggler: Straggler, step: int) -> None:
    """Add the straggler's host to RUN_DIR/excluded_hosts.json (once per host)."""
    hosts = excluded_hosts(run_dir)
    if straggler.host in hosts:
        return
    hosts[straggler.host] = {
        "rank": straggler.rank,
        "node_rank": straggler.node_rank,
        "step": step,
        "time": time.time(),
        "reason": f"straggler: compute {straggler.ratio:.2f} x the other ranks' median",
    }
    _write_json(run_dir / EXCLUDED_HOSTS_FILE, {"hosts": hosts})


def excluded_hosts(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Host -> why, from RUN_DIR/excluded_hosts.json ({} when absent or unreadable)."""
    data = _read_json(run_dir / EXCLUDED_HOSTS_FILE)
    hosts = data.get("hosts") if isinstance(data, dict) else None
    return (
        {str(k): v for k, v in hosts.items() if isinstance(v, dict)}
        if isinstance(hosts, dict)
        else {}
    )


def is_excluded(name: str, excluded: Iterable[str]) -> bool:
    """Whether a hostfile entry names an excluded host: the same name, or the same short name
    (`node-2` and `node-2.cluster`; not for IP addresses); a rank records
    `socket.gethostname()`."""
    return any(
        name == h or (_short(name) is not None and _short(name) == _short(h)) for h in excluded
    )


def _short(name: str) -> str | None:
    """The first label of a host name; None for an IP address."""
    import ipaddress

    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name.split(".", 1)[0]
    return None
