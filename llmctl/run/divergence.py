"""Pure rule of the divergence policy (`llmctl.train.divergence`): is this step divergent?

A step diverges when, after its forward and backward passes and before the optimizer applies
anything:

1. its loss is NaN or infinite, or
2. its gradient norm is NaN or infinite, or
3. `spike_factor` > 0 and its loss exceeds `spike_factor` x the median loss of the last
   `spike_window` accepted steps; the rule is silent until that many steps were accepted
   (the first steps of a run fall fast and would read as spikes the other way round).

The median, not the mean: one earlier spike that was let through does not move it. Only
accepted (non-divergent) steps enter the history, so a run of bad steps cannot teach the rule
that bad is normal. Every rank decides on the same numbers (the loss is all-reduced over DP and
PP, the grad norm over the model-parallel group), so every rank reaches the same verdict.
"""

from __future__ import annotations

import math
import statistics
from collections import deque


class DivergenceRule:
    """The verdict on one step's loss and grad norm (see the module docstring).

    Args:
        spike_factor: Loss above this times the running median diverges; 0 = spike rule off.
        spike_window: Accepted steps the median is taken over (and needed before it applies).
    """

    def __init__(self, spike_factor: float, spike_window: int) -> None:
        self.spike_factor, self.spike_window = spike_factor, spike_window
        self.history: deque[float] = deque(maxlen=spike_window)

    def verdict(self, loss: float, grad_norm: float | None) -> str | None:
        """Why this step diverges (one phrase), or None when it is fine."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"grad norm is {grad_norm}"
        if self.spike_factor > 0 and len(self.history) >= self.spike_window:
            median = statistics.median(self.history)
            if loss > self.spike_factor * median:
                return (
                    f"loss {loss:.4g} > {self.spike_factor:g} x {median:.4g} (median of the "
                    f"last {self.spike_window} steps)"
                )
        return None

    def accept(self, loss: float) -> None:
        """Record the loss of a step that was applied."""
        self.history.append(loss)
