"""SFT training at TP=2 x PP=2 (torchrun, gloo, 4 ranks) reaches the single-rank losses.

The per-example attention mask and the response-only loss mask travel with every micro-batch
to every pipeline stage; TP splits the attention heads the mask applies to. Tolerance as in
test_train_multiproc.py: 2e-5 absolute per logged loss (TP reorders fp32 sums). The single
rank uses micro-batches of 4, the four ranks micro-batches of 2: SFT's per-token loss
(llmctl.train.token_loss) makes the steps independent of how responses fall into micro-batches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from llmctl.config import compose
from llmctl.run.rundir import create_run_dir

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
pytest.importorskip("transformers")

STEPS = 6


def _overrides(prefix: str, run_dir: Path) -> list[str]:
    return [
        f"data.prefixes=[{prefix}]", "model.vocab_size=512", "model.num_layers=4",
        f"train.train_iters={STEPS}", "train.eval_interval=3", "train.warmup_iters=2",
        "checkpoint.interval=0", f"train.run_dir={run_dir}",
    ]  # fmt: skip


def _losses(run_dir: Path) -> tuple[list[float], list[float]]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records], [r["val_loss"] for r in records if r["val_loss"]]


def _torchrun(run_dir: Path, nproc: int) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--standalone", "-m", "llmctl.train.entry", str(run_dir),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_sft_tp2_pp2_matches_one_rank(tmp_path):
    import torch

    from llmctl.data.sft import SftConfig, build_sft
    from llmctl.data.sft_demo import chat_tokenizer, translate_examples, write_jsonl
    from llmctl.train import run_in_process

    tok = chat_tokenizer(tmp_path / "tok")
    src = write_jsonl(tmp_path / "task.jsonl", translate_examples(300))
    prefix = str(tmp_path / "sft")
    build_sft(SftConfig(inputs=[str(src)], output_prefix=prefix, tokenizer=str(tok), seq_length=64))

    one = tmp_path / "one"
    cfg = compose("tiny_cpu_sft", _overrides(prefix, one))  # micro-batches of 4
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_in_process(cfg, one)
    finally:
        torch.set_num_threads(threads)

    four = tmp_path / "four"
    layout = ["parallel.tp=2", "parallel.pp=2", "parallel.micro_batch_size=2"]
    create_run_dir(compose("tiny_cpu_sft", [*_overrides(prefix, four), *layout]), None)
    proc = _torchrun(four, 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    base, base_val = _losses(one)
    losses, val = _losses(four)
    assert len(losses) == STEPS and losses == pytest.approx(base, abs=2e-5)
    assert val == pytest.approx(base_val, abs=2e-5) and len(val) == 2
    assert losses[-1] < losses[0]
