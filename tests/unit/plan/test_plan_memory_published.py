"""Predicted peak memory against published measured peaks (tests/fixtures/plan/memory_peaks.json).

Rows with a published peak (torchtitan's logged max reserved memory, max over ranks) and
enough detail must be within 10 %; rows with a documented `gap` are held to the band stated
in their reason, so a change that closes or widens the gap shows up here. Every layout that
ran (every row of the fixture, its `fit_only` layouts and every row of published_runs.json)
must be predicted to fit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from memory_rows import FIXTURE, cluster, row_eval

from llmctl.plan import evaluate
from llmctl.plan.reference import row_input, row_layout

ROWS: list[dict[str, Any]] = FIXTURE["rows"]
PUBLISHED = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "plan" / "published_runs.json").read_text()
)
#: (low, high) relative error band of each documented gap, by model.
GAP_BANDS = {"llama3_70b": (-0.30, -0.15), "llama31_405b": (-0.50, -0.15)}
TRAINY_BAND = (0.30, 0.50)


def _error(row: dict[str, Any]) -> float:
    return row_eval(row).memory.total_gib / row["measured_gib"] - 1.0


def test_fixture_rows_name_their_source_and_what_was_measured() -> None:
    assert len(ROWS) >= 15 and len(FIXTURE["fit_only"]) >= 3
    for row in ROWS:
        assert row["cite"].startswith("https://github.com/") and row["measured"], row["id"]
    assert sum(r["tune"] for r in ROWS) == 1  # one row looked at, the rest held out


@pytest.mark.parametrize(
    "row",
    [r for r in ROWS if r["detail"] and not r.get("gap")],
    ids=lambda r: r["id"],
)
def test_total_within_10_percent_of_published_peak(row: dict[str, Any]) -> None:
    assert abs(_error(row)) <= 0.10, round(_error(row), 3)


@pytest.mark.parametrize("row", [r for r in ROWS if r.get("gap")], ids=lambda r: r["id"])
def test_documented_gaps_stay_as_documented(row: dict[str, Any]) -> None:
    low, high = TRAINY_BAND if row["source"] == "trainy" else GAP_BANDS[row["model"]]
    assert low <= _error(row) <= high, round(_error(row), 3)


@pytest.mark.parametrize("row", ROWS + FIXTURE["fit_only"], ids=lambda r: r["id"])
def test_every_published_layout_that_ran_is_predicted_to_fit(row: dict[str, Any]) -> None:
    assert row_eval(row).fits, round(row_eval(row).memory.total_gib, 1)


@pytest.mark.parametrize("row", PUBLISHED["rows"], ids=lambda r: r["id"])
def test_every_published_step_time_run_is_predicted_to_fit(row: dict[str, Any]) -> None:
    """published_runs.json's rows ran; the 340B row with the gradient dtype of the memory
    fixture's fit_only row (bf16: its source does not state it)."""
    row = {**row, "grad_dtype": "bf16"} if row["model"] == "nemotron4_340b" else row
    inp = row_input(row, PUBLISHED["models"], cluster(row["cluster"]))
    assert evaluate(inp, row_layout(row)).fits
