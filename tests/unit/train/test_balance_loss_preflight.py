"""`plan.balance_loss` splits: per-rank totals are the planner's (k layers off the last rank),
VPP chunks keep a layer each, and a split `llmctl train` cannot build is refused before launch
in one line naming the fields (the built model: tests/integration/test_balance_loss_split.py)."""

from __future__ import annotations

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.planning import _move_layers
from llmctl.run.preflight import preflight


def test_vpp_with_balance_loss_passes_preflight() -> None:
    base = ["parallel.pp=2", "parallel.vpp=2", "plan.balance_loss=true"]
    preflight(compose("tiny_cpu", ["model.num_layers=8", *base]), 2)
    with pytest.raises(UserError) as err:
        preflight(compose("tiny_cpu", ["model.num_layers=6", *base]), 2)
    assert "model.num_layers=6" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("per_chunk", "pp", "vpp", "k"), [(2, 8, 5, 1), (4, 2, 1, 3), (2, 2, 2, 3), (3, 4, 3, 5)]
)
def test_vpp_split_moves_k_layers_off_the_last_rank(
    per_chunk: int, pp: int, vpp: int, k: int
) -> None:
    layers = _move_layers(per_chunk, pp, vpp, k)
    k = min(k, vpp * (per_chunk - 1))  # a layer stays in each chunk
    per_rank = [sum(layers[v * pp + r] for v in range(vpp)) for r in range(pp)]
    assert sum(layers) == per_chunk * pp * vpp and min(layers) >= 1
    assert per_rank[-1] == per_chunk * vpp - k
    moved = [n - per_chunk * vpp for n in per_rank[:-1]]
    assert sum(moved) == k and max(moved) - min(moved) <= 1 and moved == sorted(moved, reverse=True)
    assert layers[-1] == max(1, per_chunk - k)  # the loss's chunk gives first (Bridge 70B: 1 layer)
