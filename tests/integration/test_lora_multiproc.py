"""LoRA at TP=2 x PP=2 (torchrun, gloo, 4 ranks): trained there, checked against PEFT.

A LoRA run (rank 4, all seven targets) trains 3 steps at TP=2 x PP=2 from an imported Mistral-shaped
model; its adapter checkpoint (saved by four ranks, B sharded on output rows for q/k/v/gate/up
and A on input columns for o/down) is exported with `llmctl export hf RUN --adapter`, and a
second launch rebuilds the adapted model at TP=2 x PP=2 (base + adapters resharded by
megatron-core's dist_checkpointing). Oracle: transformers + PEFT with the exported adapter give
the same logits within 1e-4 (fp32).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hf_support import hf_logits, imported_with_data
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.config import compose
from llmctl.run.rundir import create_run_dir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
pytest.importorskip("peft")
SCRIPT = Path(__file__).with_name("lora_logits.py")
TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


def _torchrun(*args: str) -> None:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--standalone",
            *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_lora_tp2_pp2_trains_and_matches_peft(tmp_path: Path) -> None:
    import numpy as np
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    src, prefix = imported_with_data(tmp_path, "mistral")
    run_dir = tmp_path / "run"
    cfg = compose(
        str(tmp_path / "mc" / "recipe.yaml"),
        [f"data.prefixes=[{prefix}]", f"train.run_dir={run_dir}", "train.train_iters=3",
         "train.global_batch_size=4", "parallel.micro_batch_size=1", "parallel.tp=2",
         "parallel.pp=2", "train.eval_interval=0", "train.lr=1e-2", "train.min_lr=1e-2",
         "train.warmup_iters=0", "checkpoint.interval=3", f"checkpoint.init_from=hf:{src}",
         "train.peft=lora", "train.lora.rank=4", "train.lora.alpha=8",
         f"train.lora.target_modules={TARGETS}"],
    )  # fmt: skip
    create_run_dir(cfg, None)
    _torchrun("-m", "llmctl.train.entry", str(run_dir))
    res = CliRunner().invoke(
        app, ["export", "hf", str(run_dir), "--adapter", "--out", str(tmp_path / "adapter")]
    )
    assert res.exit_code == 0, res.output
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(5))
    np.save(tmp_path / "ids.npy", ids.numpy())
    out = tmp_path / "ours.npy"
    _torchrun(str(SCRIPT), "2", "2", str(tmp_path / "ids.npy"), str(run_dir), str(out))
    ours = torch.from_numpy(np.load(out))
    base = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        theirs = peft(input_ids=ids).logits.float()
    moved = float((theirs - hf_logits(src, ids)).abs().max())
    diff = float((ours - theirs).abs().max())
    print(f"measured: PEFT vs megatron-core adapted logits at TP=2 x PP=2: {diff:.3g} "
          f"(adapters move the logits by {moved:.3g})")  # fmt: skip
    assert moved > 1e-2
    assert diff < 1e-4
