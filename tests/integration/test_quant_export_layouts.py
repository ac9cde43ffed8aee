"""Export from a checkpoint saved by a TP=2 x PP=2 run (4 ranks under torchrun).

Oracle: megatron-core itself loads the same checkpoint into a TP=1 PP=1 model (its resharding
load path, through the model's sharded state dict) and the exported model's logits match it.
llmctl's exporter reads the tensors without building a model, so the two paths are independent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from quant_support import FFN, HIDDEN, SEQ, VOCAB, build_data, megatron_logits

from llmctl.hf.export import export_run
from llmctl.quant.calibration import open_tokens

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]
REPO = Path(__file__).resolve().parents[2]


def test_export_from_tp2_pp2_checkpoint(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir

    tok_json, prefix = build_data(tmp_path)
    run_dir = tmp_path / "run"
    cfg = compose(
        "tiny_cpu",
        [
            f"model.hidden_size={HIDDEN}", f"model.ffn_hidden_size={FFN}",
            f"model.vocab_size={VOCAB}", f"model.seq_length={SEQ}",
            f"data.prefixes=[{prefix}]", f"data.tokenizer={tok_json}",
            f"data.cache_dir={tmp_path / 'cache'}", "parallel.tp=2", "parallel.pp=2",
            "checkpoint.interval=6", "train.train_iters=6", "train.lr=3e-3",
            f"train.run_dir={run_dir}",
        ],
    )  # fmt: skip
    create_run_dir(cfg, None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LLMCTL_WANDB": "off"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--standalone",
        "-m", "llmctl.train.entry", str(run_dir),
    ]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    out = tmp_path / "hf"
    assert export_run(run_dir, out).step == 6
    tokens = np.asarray(open_tokens(prefix)[-2 * SEQ :], dtype=np.int64).reshape(2, SEQ)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        got = hf(input_ids=torch.from_numpy(tokens)).logits.numpy()
    ref = megatron_logits(cfg, run_dir / "checkpoints" / "iter_0000006", tokens)
    assert np.abs(got - ref).max() < 1e-4
