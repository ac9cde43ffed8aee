"""`plan.balance_loss` builds the split the planner timed: a PP=2 model built by megatron-core
(two gloo ranks) holds, per stage, the layers `perf.loss_layers_moved` left there (the output
layer's time in layers moved off the last stage), with the embedding first and the loss last.

Why a build and no training steps: the split is decided when megatron builds the model; a
balanced PP=2 run trains the same model (measured: step-1 loss 8.339994 and grad norm 0.95293,
the same as PP=1 and as even PP=2; docs/planner.md)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from llmctl.config import compose

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
OVERRIDES = ["parallel.pp=2", "parallel.micro_batch_size=2", "plan.balance_loss=true"]


def _worker(rank: int, port: int, out: str, extra: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from llmctl.run.layout import resolve_layout
    from llmctl.run.planning import loss_balanced_stage_layers
    from llmctl.run.precision import RECIPES
    from llmctl.train import parallel
    from llmctl.train.model import build_model_chunks, transformer_config

    cfg = compose("tiny_cpu", [*OVERRIDES, *extra])
    parallel.init_distributed()
    layout = resolve_layout(cfg, 2)
    parallel.init_model_parallel(layout, 1, on_gpu=False)
    stages = loss_balanced_stage_layers(cfg, layout)
    config = transformer_config(
        cfg.model, layout, cfg.precision, RECIPES["fp32"], on_gpu=False, stage_layers=stages
    )
    chunks = build_model_chunks(cfg.model, config, layout, use_te=False, seed=1)
    built = [
        {
            "layers": [int(layer.layer_number) for layer in chunk.decoder.layers],
            "embedding": chunk.pre_process,
            "output": chunk.post_process,
        }
        for chunk in chunks
    ]
    Path(out, f"rank{rank}.json").write_text(json.dumps(built))
    parallel.teardown(destroy_process_group=True)


def _spawn(tmp_path: Path, extra: list[str]) -> list[list[dict]]:
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path), extra), nprocs=2)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _moved(num_layers: int, vpp: int) -> int:
    from llmctl.plan.layout import Layout, StageSplit
    from llmctl.plan.perf import loss_layers_moved
    from llmctl.run.planning import plan_input

    inp = plan_input(compose("tiny_cpu", [*OVERRIDES, f"model.num_layers={num_layers}"]))
    lay = Layout(pp=2, vpp=vpp, micro_batch_size=2, loss_balanced=True)
    half = num_layers // 2
    return loss_layers_moved(
        inp.model,
        inp.cluster,
        inp.run,
        lay,
        StageSplit(first=half, middle=half, last=half, method="even"),
    )


def test_pp2_balance_loss_builds_the_planned_split(tmp_path: Path) -> None:
    k = _moved(4, 1)
    assert k >= 1  # the tiny model's output layer (vocab 4096) costs more than a layer
    (first,), (last,) = _spawn(tmp_path, ["model.num_layers=4"])
    assert first["layers"] == list(range(1, 2 + k + 1)) and first["embedding"]
    assert last["layers"] == list(range(2 + k + 1, 5)) and last["output"]
    assert not first["output"] and not last["embedding"]


def test_pp2_vpp2_balance_loss_moves_the_layers_off_the_loss_chunk(tmp_path: Path) -> None:
    """16 layers on PP2 x VPP2 (chunks of 4 in model order: rank0 v0, rank1 v0, rank0 v1,
    rank1 v1): the last rank gives its k layers from its loss chunk, and rank 0's chunks take
    them in turn, first chunk first."""
    k = _moved(16, 2)
    assert 1 <= k <= 3
    sizes = [4 + (k + 1) // 2, 4, 4 + k // 2, 4 - k]
    ends = [sum(sizes[: i + 1]) for i in range(4)]
    numbers = [list(range(end - n + 1, end + 1)) for n, end in zip(sizes, ends, strict=True)]
    first, last = _spawn(tmp_path, ["model.num_layers=16", "parallel.vpp=2"])
    assert [c["layers"] for c in first] == [numbers[0], numbers[2]]
    assert [c["layers"] for c in last] == [numbers[1], numbers[3]]
    assert first[0]["embedding"] and last[1]["output"]
    assert not any(c["output"] for c in first) and not any(c["embedding"] for c in last)
