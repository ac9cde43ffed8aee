"""The saved-tensor meter of llmctl.train.memprobe on plain torch ops (no megatron)."""

from __future__ import annotations

import pytest

from llmctl.train.memprobe import SavedTensorMeter


def test_meter_counts_unique_saved_storages_and_their_release() -> None:
    torch = pytest.importorskip("torch")
    w = torch.randn(64, 32, requires_grad=True)
    x = torch.randn(16, 64, requires_grad=True)
    meter = SavedTensorMeter(exclude={w.untyped_storage().data_ptr()})
    with meter:
        h = x @ w  # saves x (and w, excluded)
        y = torch.relu(h)  # saves its output
        z = (y * y).sum()  # saves y twice: one storage
    assert meter.saved == x.numel() * 4 + y.numel() * 4
    assert meter.live == meter.saved == meter.peak
    z.backward()
    assert meter.live == 0 and meter.peak == meter.saved


def test_meter_ignores_saves_made_during_backward() -> None:
    """A recomputation inside backward (checkpointing) is live at peak, not a forward save."""
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(32, 32, requires_grad=True)
    meter = SavedTensorMeter()
    with meter:
        out = checkpoint(lambda t: torch.tanh(t).exp(), x, use_reentrant=True).sum()
        fwd = meter.saved
        out.backward()
    assert fwd == x.numel() * 4  # the checkpoint keeps its input only
    assert meter.saved == fwd
    assert meter.peak > fwd  # the recomputed tanh/exp outputs were alive in backward
