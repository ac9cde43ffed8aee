from __future__ import annotations

import io
import logging

from rich.console import Console

from llmctl.run.metrics import StepMetrics
from llmctl.train.panel import Panel


def _metrics(step: int) -> StepMetrics:
    return StepMetrics(
        step=step,
        loss=7.25,
        lr=3e-4,
        grad_norm=1.5,
        step_time_s=0.5,
        tokens_per_s=1024.0,
        tflops_per_device=0.04,
        mfu=0.25,
        mem_gib=1.2,
        consumed_samples=8 * step,
        val_loss=None,
    )


def test_live_panel_shows_every_field():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with Panel("llmctl train: tiny", 10, "host RSS GiB", live=True, console=console) as panel:
        panel.update(_metrics(10), eta_s=0.0)
    text = out.getvalue()
    for needle in (
        "10/10",
        "7.2500",
        "3.000e-04",
        "1.500",
        "1,024",
        "0.040",
        "25.0%",
        "host RSS GiB",
        "1.20",
        "0:00",
        "llmctl train: tiny",
    ):
        assert needle in text, needle


def test_without_terminal_one_log_line_per_step(caplog):
    with (
        caplog.at_level(logging.INFO, logger="llmctl.train"),
        Panel("t", 50, "GPU mem GiB", live=False) as panel,
    ):
        panel.update(_metrics(3), eta_s=3725.0)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("step=3/50  loss=7.2500")
    assert "val loss=n/a" in line and "ETA=1:02:05" in line and "MFU=25.0%" in line


def test_latest_validation_loss_stays_on_screen(caplog):
    with (
        caplog.at_level(logging.INFO, logger="llmctl.train"),
        Panel("t", 50, "GPU mem GiB", live=False) as panel,
    ):
        with_val = _metrics(5)
        with_val.val_loss = 6.5
        panel.update(with_val, eta_s=1.0)
        panel.update(_metrics(6), eta_s=1.0)
    assert ["val loss=6.5000" in r.getMessage() for r in caplog.records] == [True, True]
