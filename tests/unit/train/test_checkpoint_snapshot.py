"""An async save writes the state as of `save()`, even when training mutates it at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

from llmctl.config import compose


def _corpus(prefix: Path) -> Path:
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(100):
        n = int(rng.integers(20, 200))
        builder.add_document(torch.from_numpy(rng.integers(1, 4000, n).astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def test_async_save_is_a_snapshot_despite_in_place_updates(tmp_path: Path) -> None:
    """Params and Adam moments change in place right after `save()` returns (as the next step
    would); the checkpoint must still hold the values of the saved step, SwiGLU halves included.
    Fails if the writer reads live memory (e.g. a thread or a persistent worker on CPU)."""
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import DistCheckpointer, _unwrap, sharded_state_dict

    (tmp_path / "d").mkdir()
    prefix = _corpus(tmp_path / "d" / "c")
    cfg = compose("tiny_cpu", [
        "train.train_iters=3", "train.eval_interval=0", f"data.prefixes=[{prefix}]",
        f"data.cache_dir={tmp_path / 'cache'}", "checkpoint.interval=1000",
    ])  # fmt: skip
    assert str(getattr(cfg.model.activation, "value", cfg.model.activation)) == "swiglu"
    seen: dict[str, Any] = {}

    class Probe(DistCheckpointer):
        def after_step(self, state: Any) -> None:
            if state.step != 2:
                return
            model = _unwrap(state.model[0])
            before = {k: v.detach().clone() for k, v in model.state_dict().items()
                      if isinstance(v, torch.Tensor) and "_extra_state" not in k}  # fmt: skip
            self.save(state, use_async=True)
            with torch.no_grad():  # the next optimizer step, only sooner and bigger
                for p in model.parameters():
                    p.add_(1.0)
                for st in state.optimizer.optimizer.state.values():
                    for t in st.values():
                        if isinstance(t, torch.Tensor) and t.dim() > 0:
                            t.add_(1.0)
            self.wait()
            ckpt = self.root / "iter_0000002"
            loaded = dist_checkpointing.load(sharded_state_dict(state, is_loading=True), str(ckpt))
            seen["before"] = before  # `load` fills the params in place: clone them now
            seen["loaded"] = {k: v.detach().clone() for k, v in loaded["model"].items()
                              if isinstance(v, torch.Tensor)}  # fmt: skip
            seen["fc1_views"] = sum("linear_fc1.weight" in k for k in before)

    try:
        run_in_process(cfg, tmp_path / "run", checkpointer=Probe(cfg, tmp_path / "run"))
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
    before, loaded = seen["before"], seen["loaded"]
    assert seen["fc1_views"] > 0
    bad = {k: float((loaded[k] - v).abs().max()) for k, v in before.items()
           if not torch.equal(loaded[k], v)}  # fmt: skip
    assert not bad, f"checkpoint differs from the saved step: {bad}"
