"""Logits of a LoRA run's adapted model on megatron-core, at any TP x PP (also under torchrun).

Usage: torchrun --nproc-per-node=N lora_logits.py TP PP IDS.npy RUN_DIR OUT.npy

Every rank builds its GPTModel shard with llmctl's builder, adds the adapters
(`llmctl.train.lora.apply_lora`), loads the base with `load_base` (what training does on every
start) and the adapters from the run's newest checkpoint through megatron-core's
`dist_checkpointing` (resharded to this layout), runs megatron's forward-only pipeline schedule
and, on the last stage, gathers the vocab-parallel logits over TP; the last stage's TP rank 0
saves them.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _forward_step(data: Any, model: Any, ids: Any) -> tuple[Any, Any]:
    import torch
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    next(data)
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    output = model(ids, pos, None)

    def collect(out: Any, non_loss_data: bool = False) -> Any:
        assert non_loss_data
        return gather_from_tensor_model_parallel_region(out).detach()

    return output, collect


def adapted_chunks(run_dir: Path, layout: Any, seq_length: int) -> list[Any]:
    """This rank's model chunks of the run: base + adapters of its newest checkpoint."""
    from megatron.core import dist_checkpointing

    from llmctl.config import load_resolved
    from llmctl.run import ckpt_store as store
    from llmctl.run.precision import recipe_for
    from llmctl.train import lora
    from llmctl.train import model as M

    cfg = load_resolved(run_dir / "config.yaml")
    cfg.model.seq_length = seq_length
    tc = M.transformer_config(
        cfg.model, layout, cfg.precision, recipe_for(cfg.precision), on_gpu=False
    )
    chunks = M.build_model_chunks(cfg.model, tc, layout, use_te=False, seed=7)
    lora.apply_lora(chunks, cfg, layout)
    assert lora.load_base(SimpleNamespace(model=chunks, layout=layout), cfg, run_dir)
    root = run_dir / "checkpoints"
    ckpt = root / store.iter_name(store.committed_steps(root)[-1])
    sd = {"model": lora.checkpoint_view(chunks[0], chunks[0].sharded_state_dict())}
    loaded = dist_checkpointing.load(sd, str(ckpt))
    lora.load_view(chunks[0], loaded["model"])
    return chunks


def logits(run_dir: Path, ids: Any, layout: Any) -> Any:
    """Logits of the adapted model (None on ranks other than the last stage)."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = adapted_chunks(run_dir, layout, int(ids.shape[1]))
    for c in chunks:
        c.eval()
    with torch.no_grad():
        out = get_forward_backward_func()(
            forward_step_func=partial(_forward_step, ids=ids),
            data_iterator=iter([None]),
            model=chunks[0],
            num_microbatches=1,
            seq_length=int(ids.shape[1]),
            micro_batch_size=int(ids.shape[0]),
            forward_only=True,
            collect_non_loss_data=True,
        )
    return out[0] if out else None


def main(tp: int, pp: int, ids_path: Path, run_dir: Path, result: Path) -> None:
    import numpy as np
    import torch
    from megatron.core import parallel_state as ps

    from llmctl.plan import Layout, Sharding
    from llmctl.train import parallel

    parallel.init_distributed()
    layout = Layout(tp=tp, pp=pp, optimizer_sharding=Sharding.none)
    parallel.init_model_parallel(layout, 1, False)
    ids = torch.from_numpy(np.load(ids_path))
    out = logits(run_dir, ids, layout)
    if ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0:
        np.save(result, out.float().numpy())
    parallel.teardown(destroy_process_group=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), Path(a[2]), Path(a[3]), Path(a[4]))
