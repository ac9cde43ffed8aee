"""The CPU compatibility layer: installed only without CUDA, undone by uninstall()."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only layer")


@pytest.fixture
def compat():
    from llmctl.train import cpu_compat

    cpu_compat.install()
    yield cpu_compat
    cpu_compat.uninstall()


def test_cuda_requests_land_on_cpu(compat):
    t = torch.zeros(3, device="cuda")
    assert t.device.type == "cpu"
    assert t.type() == "torch.cuda.FloatTensor"
    assert torch.ones(2).to("cuda").device.type == "cpu"
    assert torch.ones(2).cuda().device.type == "cpu"
    assert torch.empty(1, device=torch.cuda.current_device()).device.type == "cpu"
    torch.cuda.synchronize()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    with torch.cuda.stream(torch.cuda.Stream()):
        pass


def test_uninstall_restores_plain_torch(compat):
    compat.uninstall()
    assert not compat.is_installed()
    assert torch.zeros(1).type() == "torch.FloatTensor"
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")


def test_rng_tracker_forks_cpu_states_with_megatron_offsets(compat):
    from megatron.core.tensor_parallel import random as mrandom

    compat.seed_model_parallel_rng(7, tp_rank=1)
    tracker = mrandom.get_cuda_rng_tracker()
    assert isinstance(tracker, mrandom.CudaRNGStatesTracker)
    outer = torch.get_rng_state()
    with tracker.fork():
        a = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), outer)
    assert torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(7 + 2718 + 1)))
    with tracker.fork():
        b = torch.rand(4)
    assert not torch.equal(a, b)  # the forked stream advanced


def test_install_refuses_on_cuda_machines(monkeypatch):
    from llmctl.train import cpu_compat

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="refusing"):
        cpu_compat.install()
