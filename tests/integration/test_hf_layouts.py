"""Imported checkpoints load at TP=2 x PP=2 and give transformers' logits (one torchrun launch).

Four ranks (gloo, CPU) each build their GPTModel shard, load the import with the weights-only
loader that `checkpoint.init_from` uses, and run megatron's forward-only pipeline schedule; the
last stage gathers the vocab-parallel logits. Three families in the one launch: Llama with a
padded vocab (300 -> 384, split over TP), Qwen2 (Q/K/V biases, tied embeddings whose output copy
lives on the last stage) and Mixtral (MoE experts split over TP). Tolerance 1e-4 as at TP=1;
TP adds partial-sum rounding only (measured <= 3e-7).

A second launch trains from an import at PP=2 x VPP=2 (`checkpoint.init_from`, two ranks,
interleaved schedule): the step-1 loss equals transformers' loss on the same two samples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_support import hf_logits, imported_with_data, make_model
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
FAMILIES = ("llama", "qwen2", "mixtral")
SCRIPT = Path(__file__).with_name("hf_layout_logits.py")


def test_tp2_pp2_logits_match_transformers(tmp_path: Path) -> None:
    import numpy as np
    import torch

    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3))
    np.save(tmp_path / "ids.npy", ids.numpy())
    pairs: list[str] = []
    for family in FAMILIES:
        src = make_model(family, tmp_path / family)
        out = tmp_path / f"{family}-mc"
        res = CliRunner().invoke(app, ["import", "hf", str(src), "--out", str(out), "--tp", "2"])
        assert res.exit_code == 0, res.output
        pairs += [str(out), str(tmp_path / f"{family}.npy")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--standalone",
           str(SCRIPT), "2", "2", str(tmp_path / "ids.npy"), *pairs]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for family in FAMILIES:
        src = tmp_path / family
        vocab = json.loads((src / "config.json").read_text())["vocab_size"]
        ours = torch.from_numpy(np.load(tmp_path / f"{family}.npy"))
        diff = float((ours[..., :vocab] - hf_logits(src, ids)).abs().max())
        print(f"measured: {family} max |logit difference| at TP=2 x PP=2 {diff:.3g}")
        assert diff < 1e-4, f"{family} at TP=2 x PP=2: max |logit difference| {diff}"
        assert float(ours[..., vocab:].abs().sum()) == 0.0


def _hf_batch_loss(src: Path, samples: list[dict[str, object]]) -> float:
    """Mean over micro-batches (one sample each) of the masked token-mean loss, as megatron."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    losses = []
    for s in samples:
        with torch.no_grad():
            logits = model(input_ids=torch.as_tensor(s["tokens"])[None]).logits[0]
        ce = F.cross_entropy(logits, torch.as_tensor(s["labels"]), reduction="none")
        mask = torch.as_tensor(s["loss_mask"]).float()
        losses.append(float((ce * mask).sum() / mask.sum()))
    return sum(losses) / len(losses)


def test_init_from_at_pp2_vpp2_first_loss_is_transformers_loss(tmp_path: Path) -> None:
    from llmctl.config import compose
    from llmctl.run.data import resolve_data
    from llmctl.run.rundir import create_run_dir
    from llmctl.train.data import build_datasets

    src, prefix = imported_with_data(tmp_path)  # mistral, vocab 256: no padded logits in the loss
    run_dir = tmp_path / "run"
    cfg = compose(
        str(tmp_path / "mc" / "recipe.yaml"),
        [f"data.prefixes=[{prefix}]", f"train.run_dir={run_dir}", "train.train_iters=2",
         "train.global_batch_size=2", "parallel.micro_batch_size=1", "parallel.pp=2",
         "parallel.vpp=2", "train.eval_interval=0"],
    )  # fmt: skip
    create_run_dir(cfg, None)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
           "-m", "llmctl.train.entry", str(run_dir)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train, _ = build_datasets(cfg, resolve_data(cfg), 2 * 2, 1)
    expected = _hf_batch_loss(src, [train[0], train[1]])
    print(
        f"measured: PP=2 x VPP=2 step-1 loss {records[0]['loss']:.6f}, transformers {expected:.6f}"
    )
    assert records[0]["step"] == 1
    assert records[0]["loss"] == pytest.approx(expected, abs=1e-4)
