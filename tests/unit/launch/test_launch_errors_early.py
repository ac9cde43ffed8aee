"""A dry run reports what the real launch would refuse: GPU-only precision, missing data."""

from __future__ import annotations

import pytest

from llmctl.errors import UserError
from llmctl.launch.api import prepare_train


def test_dry_run_checks_precision_before_planning() -> None:
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        prepare_train("tiny_cpu", ["precision=fp8_delayed"])


def test_dry_run_checks_explicit_data_prefix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UserError, match=r"x\.bin not found"):
        prepare_train("tiny_cpu", [f"data.prefixes=[{tmp_path}/x]"])
