"""The plan a run is launched with, as recorded in RUN_DIR/plan.json: one typed, versioned record.

`llmctl train` plans the run, records the chosen layout and the planner's predictions
(`PlanRecord.of`), and the ranks read them back to train that layout and to compare the
measured step time and memory with the predicted ones (perf.json). `PlanRecord.from_dict`
reads what every earlier version wrote.

Versions of plan.json:
- absent key = 1: written before plan.json carried `version` (the same keys; the `layout`
  of the earliest files lacks `loss_balanced` and `etp`, which then take their defaults).
- 2: the same keys with `version` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmctl.plan.layout import Layout, layout_from_dict
from llmctl.plan.search import Evaluation, PlanResult

PLAN_RECORD_VERSION = 2
"""The plan.json version this llmctl writes (and the newest it reads)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRecord:
    """The chosen layout of a run's plan and what the planner predicts for it."""

    layout: Layout
    layout_name: str
    """`Layout.short()` of the layout."""
    fits: bool
    """Whether the predicted peak fits the usable memory (False only with `--ignore-fit`)."""
    peak_mem_gib: float
    """Predicted peak memory per device, GiB."""
    usable_gib: float
    """Usable memory per device, GiB (HBM less the headroom)."""
    memory_gib: dict[str, float]
    """The predicted peak's terms (`MemoryBreakdown.terms`), GiB."""
    step_time_s: float
    """Predicted seconds per optimizer step."""
    tokens_per_s: float
    """Predicted tokens per second, all devices together."""
    mfu: float
    """Predicted model FLOP utilisation."""
    version: int = PLAN_RECORD_VERSION
    """The plan.json version it was read from (files are written at `PLAN_RECORD_VERSION`)."""

    @classmethod
    def of(cls, result: PlanResult, chosen: Evaluation) -> PlanRecord:
        """The record of `chosen`, one evaluation of `result`."""
        return cls(
            layout=chosen.layout,
            layout_name=chosen.layout.short(),
            fits=chosen.fits,
            peak_mem_gib=chosen.memory.total_gib,
            usable_gib=result.usable_gib,
            memory_gib=chosen.memory.terms(),
            step_time_s=chosen.time.total_s,
            tokens_per_s=chosen.rates.tokens_per_s_per_gpu * chosen.layout.world_size,
            mfu=chosen.rates.mfu,
        )

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON shows it (`train --dry-run`, a checkpoint's train_state.json):
        plan.json's keys without `version`."""
        return {
            "layout": self.layout.as_dict(),
            "layout_name": self.layout_name,
            "fits": self.fits,
            "peak_mem_gib": self.peak_mem_gib,
            "usable_gib": self.usable_gib,
            "memory_gib": dict(self.memory_gib),
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
        }

    def file_dict(self) -> dict[str, Any]:
        """The content of plan.json: `version` (always `PLAN_RECORD_VERSION`), then `as_dict`."""
        return {"version": PLAN_RECORD_VERSION, **self.as_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanRecord | None:
        """The record of a plan.json object of any version; None for `{}` (a run without a plan).

        Raises:
            ValueError: a version newer than this llmctl reads, or a malformed record (the
                missing key or bad value is named).
        """
        if not data:
            return None
        version = data.get("version", 1)
        if not isinstance(version, int) or not 1 <= version <= PLAN_RECORD_VERSION:
            raise ValueError(
                f"version {version!r} is not one this llmctl reads (1 to {PLAN_RECORD_VERSION});"
                " it was written by another llmctl"
            )
        try:
            layout = layout_from_dict(data["layout"])
        except KeyError as exc:
            key = exc.args[0]
            raise ValueError(
                "no 'layout'" if key == "layout" else f"layout.{key}: not a layout field"
            ) from None
        except (AttributeError, TypeError) as exc:
            raise ValueError(f"layout: {exc}") from None
        try:
            return cls(
                layout=layout,
                layout_name=str(data["layout_name"]),
                fits=bool(data["fits"]),
                peak_mem_gib=float(data["peak_mem_gib"]),
                usable_gib=float(data["usable_gib"]),
                memory_gib={str(k): float(v) for k, v in data["memory_gib"].items()},
                step_time_s=float(data["step_time_s"]),
                tokens_per_s=float(data["tokens_per_s"]),
                mfu=float(data["mfu"]),
                version=version,
            )
        except KeyError as exc:
            raise ValueError(f"no {exc.args[0]!r}") from None
        except (AttributeError, TypeError) as exc:
            raise ValueError(str(exc)) from None
