"""Rank 0's live view of a run: a rich panel with a progress bar, or plain log lines.

On a terminal the panel shows step, loss, validation loss, LR, grad norm, tokens/s, TFLOP/s per
device, MFU against the device peak, memory and ETA, and redraws at most twice a second (manual
refresh, no background thread, so it costs nothing measurable per step). Without a terminal
(batch jobs, tests) it writes one log line per logged step instead.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from llmctl.run.metrics import StepMetrics

log = logging.getLogger("llmctl.train")


def _fmt_eta(seconds: float) -> str:
    if seconds != seconds or seconds < 0:  # NaN
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _row(
    m: StepMetrics, total: int, eta_s: float, mem_label: str, last_val: float | None
) -> list[tuple[str, str]]:
    def opt(x: float | None, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    return [
        ("step", f"{m.step}/{total}"),
        ("loss", f"{m.loss:.4f}"),
        ("val loss", opt(m.val_loss if m.val_loss is not None else last_val, ".4f")),
        ("lr", f"{m.lr:.3e}"),
        ("grad norm", opt(m.grad_norm, ".3f")),
        ("tokens/s", f"{m.tokens_per_s:,.0f}"),
        ("TFLOP/s/device", f"{m.tflops_per_device:.3f}"),
        ("MFU", opt(None if m.mfu is None else 100 * m.mfu, ".1f") + "%"),
        (mem_label, opt(m.mem_gib, ".2f")),
        ("ETA", _fmt_eta(eta_s)),
    ]


class Panel:
    """Live panel (terminal) or log lines (otherwise)."""

    def __init__(
        self,
        title: str,
        total_steps: int,
        mem_label: str,
        live: bool | None = None,
        console: Any = None,
    ):
        self.total, self.mem_label, self.title = total_steps, mem_label, title
        self.live_mode = sys.stdout.isatty() if live is None else live
        self.console = console
        self._live: Any = None
        self._progress: Any = None
        self._task: Any = None
        self._last_draw = 0.0
        self._last_val: float | None = None

    def __enter__(self) -> Panel:
        if self.live_mode:
            from rich.live import Live
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self._progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task("training", total=self.total)
            self._live = Live(auto_refresh=False, transient=False, console=self.console)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(None, None, None)

    def update(self, m: StepMetrics, eta_s: float) -> None:
        """Show one logged step (the validation loss shown is the latest one measured)."""
        import time

        if m.val_loss is not None:
            self._last_val = m.val_loss
        rows = _row(m, self.total, eta_s, self.mem_label, self._last_val)
        if not self.live_mode:
            log.info("  ".join(f"{k}={v}" for k, v in rows))
            return
        self._progress.update(self._task, completed=m.step)
        now = time.monotonic()
        if now - self._last_draw < 0.5 and m.step < self.total:
            return
        self._last_draw = now
        self._live.update(self._render(rows), refresh=True)

    def _render(self, rows: list[tuple[str, str]]) -> Any:
        from rich.console import Group
        from rich.panel import Panel as RichPanel
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        for _ in range(4):
            table.add_column()
        pairs = [(f"[bold]{k}[/]", v) for k, v in rows]
        for i in range(0, len(pairs), 2):
            cells = [c for p in pairs[i : i + 2] for c in p]
            table.add_row(*cells)
        return RichPanel(Group(table, self._progress), title=self.title)
