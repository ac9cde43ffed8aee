"""`plan.balance_loss` with a split `llmctl train` cannot build is refused before launch, in one
line naming the fields (the split itself: tests/integration/test_balance_loss_split.py)."""

from __future__ import annotations

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.train.preflight import preflight


def test_balanced_split_with_vpp_is_refused() -> None:
    overrides = ["model.num_layers=4", "parallel.pp=2", "parallel.vpp=2", "plan.balance_loss=true"]
    with pytest.raises(UserError) as err:
        preflight(compose("tiny_cpu", overrides), 2)
    msg = str(err.value)
    assert msg.startswith("plan.balance_loss=true with parallel.vpp=2: llmctl train builds")
    assert "\n" not in msg
