"""`llmctl top RUN_DIR`: a live view of a run from its directory, as plain text lines.

Everything comes from the run directory, so it works over a log-only SSH session and on a login
node that shares the run's filesystem, with no Prometheus: the launcher's state (`run_status`),
the last metrics.jsonl records (step, when, loss, tokens/s, MFU, memory), plan.json (the
predicted step time, tokens/s, MFU and memory), stragglers.json (who is named now, and the last
window's per-rank compute and reduce times), the newest committed checkpoint under
RUN_DIR/checkpoints and starts.jsonl (restarts). `top_frame` reads one frame, `render_top`
turns it into lines, `watch` repeats until the run finishes.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmctl.errors import UserError

TAIL_BYTES = 256 * 1024
STEADY_RECORDS = 20
MAX_RANK_ROWS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class TopFrame:
    """One look at a run: measured beside predicted; None where not known (yet)."""

    run_dir: str
    time: float
    state: str
    finished: bool
    step: int | None = None
    total_steps: int | None = None
    last_step_age_s: float | None = None
    loss: float | None = None
    step_time_s: float | None = None
    """Median of the last (up to) 20 logged steps' wall times."""
    predicted_step_s: float | None = None
    tokens_per_s: float | None = None
    predicted_tokens_per_s: float | None = None
    mfu: float | None = None
    predicted_mfu: float | None = None
    mem_gib: float | None = None
    predicted_mem_gib: float | None = None
    eta_s: float | None = None
    checkpoint_step: int | None = None
    checkpoint_age_s: float | None = None
    restarts: int | None = None
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    straggler_settings: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """The last straggler window's per-rank figures (rank, host, compute_s, reduce_s, slow)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for --json."""
        return asdict(self)


def _tail_records(path: Path, num: int) -> list[dict[str, Any]]:
    """The last `num` whole JSON records of a JSONL file (reads only its last 256 KiB)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    out: list[dict[str, Any]] = []
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out.append(rec)
            if len(out) == num:
                break
    return out[::-1]


def _checkpoint(run_dir: Path, now: float) -> tuple[int | None, float | None]:
    """(step, age s) of the newest committed checkpoint under RUN_DIR/checkpoints."""
    from llmctl.run.ckpt_store import committed_steps, iter_name

    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None, None
    try:
        steps = committed_steps(root)
        if not steps:
            return None, None
        return steps[-1], now - (root / iter_name(steps[-1])).stat().st_mtime
    except OSError:
        return None, None


def _plan(run_dir: Path) -> dict[str, float | None]:
    from llmctl.run.rundir import read_plan

    try:
        plan = read_plan(run_dir)
    except UserError:
        plan = None
    if plan is None:
        return {}
    return {
        "predicted_step_s": plan.step_time_s,
        "predicted_tokens_per_s": plan.tokens_per_s,
        "predicted_mfu": plan.mfu,
        "predicted_mem_gib": plan.peak_mem_gib,
    }


def top_frame(run_dir: str | Path) -> TopFrame:
    """Read one frame of a run directory.

    Raises:
        UserError: Not a run directory started by `llmctl train`.
    """
    from llmctl.launch.jobs import run_status
    from llmctl.run.prom import read_starts
    from llmctl.run.rundir import METRICS_FILE
    from llmctl.run.straggler import read_stragglers

    rd = Path(run_dir)
    st = run_status(str(rd))
    now = time.time()
    recs = _tail_records(rd / METRICS_FILE, STEADY_RECORDS)
    last = recs[-1] if recs else {}
    times = [r["step_time_s"] for r in recs if isinstance(r.get("step_time_s"), (int, float))]
    step_s = statistics.median(times) if times else None
    step, total = last.get("step"), st.total_steps
    ckpt_step, ckpt_age = _checkpoint(rd, now)
    starts = read_starts(rd)
    strag = read_stragglers(rd) or {}
    keys = ("window_steps", "margin", "windows", "policy")
    settings: dict[str, Any] = {k: strag[k] for k in keys if k in strag}
    return TopFrame(
        run_dir=str(rd), time=now, state=st.state, finished=st.finished, step=step,
        total_steps=total,
        last_step_age_s=now - last["time"] if isinstance(last.get("time"), (int, float)) else None,
        loss=last.get("loss"), step_time_s=step_s, tokens_per_s=last.get("tokens_per_s"),
        mfu=last.get("mfu"), mem_gib=last.get("mem_gib"),
        eta_s=step_s * (total - step) if step_s and total and isinstance(step, int) else None,
        checkpoint_step=ckpt_step, checkpoint_age_s=ckpt_age,
        restarts=starts.restarts if starts.num_starts else None,
        stragglers=[s for s in strag.get("current", []) if isinstance(s, dict)],
        straggler_settings={**settings, "step": strag.get("step")} if settings else None,
        ranks=[r for r in strag.get("last_window", []) if isinstance(r, dict)],
        **_plan(rd),
    )  # fmt: skip


# ----- text -----
def _dur(s: float | None) -> str:
    if s is None:
        return "?"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _vs(measured: float | None, predicted: float | None, fmt: Callable[[float], str]) -> str:
    """`measured   plan predicted (ratio)`; '?' for what is not known."""
    text = fmt(measured) if measured is not None else "?"
    if predicted:
        text += f"   plan {fmt(predicted)}"
        if measured is not None:
            text += f"   ({measured / predicted:.2f} x plan)"
    return text


def render_top(f: TopFrame) -> list[str]:
    """The frame as plain text lines (no colour, no cursor control)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(f.time))
    lines = [f"llmctl top  {f.run_dir}  {f.state}  {when}"]
    if f.step is None:
        lines.append("step        no step logged yet")
    else:
        pct = f" ({100 * f.step / f.total_steps:.0f} %)" if f.total_steps else ""
        loss = f"   loss {f.loss:.4f}" if isinstance(f.loss, float) else ""
        eta = f"   ETA {_dur(f.eta_s)}" if f.eta_s is not None and not f.finished else ""
        lines.append(
            f"step        {f.step}/{f.total_steps or '?'}{pct}   last step "
            f"{_dur(f.last_step_age_s)} ago{loss}{eta}"
        )
    lines += [
        f"step time   {_vs(f.step_time_s, f.predicted_step_s, lambda v: f'{v:.3f} s')}",
        f"tokens/s    {_vs(f.tokens_per_s, f.predicted_tokens_per_s, lambda v: f'{v:.0f}')}",
        f"MFU         {_vs(f.mfu, f.predicted_mfu, lambda v: f'{100 * v:.1f} %')}",
        f"memory      {_vs(f.mem_gib, f.predicted_mem_gib, lambda v: f'{v:.2f} GiB')}",
    ]
    if f.checkpoint_step is None:
        lines.append("checkpoint  none committed")
    else:
        lines.append(f"checkpoint  step {f.checkpoint_step}, {_dur(f.checkpoint_age_s)} ago")
    if f.restarts is not None:
        lines.append(f"restarts    {f.restarts}")
    lines += _straggler_lines(f)
    return lines


def _straggler_lines(f: TopFrame) -> list[str]:
    s = f.straggler_settings
    if s is None:
        return ["stragglers  not measured (one rank, detection off, or no window ended yet)"]
    named = ", ".join(
        f"rank {x.get('rank')} on {x.get('host')} (+{100 * (float(x.get('ratio', 1)) - 1):.0f} %, "
        f"since step {x.get('since_step')})"
        for x in f.stragglers
    )
    lines = [
        f"stragglers  {named or 'none'}   (window {s.get('window_steps')} steps, margin "
        f"{100 * float(s.get('margin', 0)):.0f} %, {s.get('windows')} windows; last window "
        f"at step {s.get('step')})"
    ]
    rows = sorted(f.ranks, key=lambda r: -float(r.get("compute_s", 0)))[:MAX_RANK_ROWS]
    for r in sorted(rows, key=lambda r: int(r.get("rank", 0))):
        mark = "  slow" if r.get("slow") else ""
        compute, reduce = float(r.get("compute_s", 0)), float(r.get("reduce_s", 0))
        lines.append(
            f"  rank {r.get('rank'):>4} {r.get('host')!s:<16} compute {compute:.3f} s   "
            f"reduce {reduce:.3f} s{mark}"
        )
    if len(f.ranks) > len(rows):
        lines.append(f"  ... {len(f.ranks) - len(rows)} more ranks (the slowest {len(rows)} shown)")
    return lines


def watch(
    run_dir: str | Path,
    emit: Callable[[TopFrame], None],
    *,
    interval_s: float = 5.0,
    once: bool = False,
    max_frames: int | None = None,
) -> TopFrame:
    """Emit a frame every `interval_s` until the run finishes (or once). Returns the last.

    Raises:
        UserError: `interval_s` below 0.5 s, or not a run directory.
    """
    if not interval_s >= 0.5:
        raise UserError(f"--interval must be >= 0.5 seconds, got {interval_s}")
    num = 0
    while True:
        frame = top_frame(run_dir)
        emit(frame)
        num += 1
        if once or frame.finished or (max_frames is not None and num >= max_frames):
            return frame
        time.sleep(interval_s)
