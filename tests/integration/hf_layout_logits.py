"""Under torchrun: logits of an imported checkpoint loaded at TP x PP (weights-only load path).

Usage: torchrun --nproc-per-node=N hf_layout_logits.py TP PP IDS.npy IMPORT_DIR OUT.npy [...]

(one IMPORT_DIR OUT.npy pair per model; one launch covers several models)

Every rank builds its GPTModel shard with llmctl's builder, loads the imported checkpoint with
`llmctl.train.init_from.load_model_weights` (what `checkpoint.init_from` uses), runs megatron's
forward-only pipeline schedule and, on the last stage, gathers the vocab-parallel logits over
TP; the last stage's TP rank 0 saves them for the test to compare with transformers.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
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


def _logits(out_dir: Path, ids: Any, layout: Any) -> Any:
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from llmctl.config import load_resolved
    from llmctl.run.init_from import checkpoint_dir
    from llmctl.run.precision import recipe_for
    from llmctl.train import model as M
    from llmctl.train.init_from import load_model_weights

    cfg = load_resolved(out_dir / "config.yaml")
    cfg.model.seq_length = int(ids.shape[1])
    prec = recipe_for(cfg.precision)
    tc = M.transformer_config(cfg.model, layout, cfg.precision, prec, on_gpu=False)
    chunks = M.build_model_chunks(cfg.model, tc, layout, use_te=False, seed=7)
    load_model_weights(chunks, checkpoint_dir(out_dir))
    for c in chunks:
        c.eval()
    with torch.no_grad():
        store = get_forward_backward_func()(
            forward_step_func=partial(_forward_step, ids=ids),
            data_iterator=iter([None]),
            model=chunks[0],
            num_microbatches=1,
            seq_length=int(ids.shape[1]),
            micro_batch_size=int(ids.shape[0]),
            forward_only=True,
            collect_non_loss_data=True,
        )
    return store[0] if store else None


def main(tp: int, pp: int, ids_path: Path, pairs: list[tuple[Path, Path]]) -> None:
    import numpy as np
    import torch
    from megatron.core import parallel_state as ps

    from llmctl.plan import Layout, Sharding
    from llmctl.train import parallel

    parallel.init_distributed()
    layout = Layout(tp=tp, pp=pp, optimizer_sharding=Sharding.none)
    parallel.init_model_parallel(layout, 1, False)
    ids = torch.from_numpy(np.load(ids_path))
    for out_dir, result in pairs:
        logits = _logits(out_dir, ids, layout)
        if ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0:
            np.save(result, logits.float().numpy())
    parallel.teardown(destroy_process_group=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(
        int(a[0]),
        int(a[1]),
        Path(a[2]),
        [(Path(d), Path(o)) for d, o in zip(a[3::2], a[4::2], strict=True)],
    )
