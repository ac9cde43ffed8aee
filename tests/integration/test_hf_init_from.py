"""Continued pretraining from a Hugging Face model: `checkpoint.init_from=hf:DIR`.

The run imports the directory itself (into RUN_DIR/init_from/), loads the weights only (step 0,
fresh optimizer and LR schedule) and trains. Oracle: transformers' loss of the same model on
the run's first batch (the same GPTDataset sample megatron's loop consumes first) equals the
loss the run logs for step 1, which is computed before the first update. Tolerance 1e-4
absolute on a loss of ~5.5 (fp32; measured difference ~1e-6: summation order only). Then the
loss falls (mean of the last 3 steps at least 0.5 below step 1; measured ~2 nats lower after
12 steps at lr 3e-3 on this repetitive corpus).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hf_support import imported_with_data

pytestmark = [pytest.mark.slow]
STEPS = 12


def _first_sample(cfg: object) -> dict[str, object]:
    from llmctl.run.data import resolve_data
    from llmctl.train.data import build_datasets

    train, _ = build_datasets(cfg, resolve_data(cfg), STEPS, 1)
    return train[0]  # global batch 1, DP 1: the loop's first micro-batch is sample 0


def _hf_loss(src: Path, sample: dict[str, object]) -> float:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    tokens = torch.as_tensor(sample["tokens"])[None]
    labels = torch.as_tensor(sample["labels"])
    mask = torch.as_tensor(sample["loss_mask"]).float()
    with torch.no_grad():
        logits = model(input_ids=tokens).logits[0].float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    return float((ce * mask).sum() / mask.sum())


def test_init_from_hf_first_loss_is_transformers_loss_and_falls(tmp_path: Path) -> None:
    from llmctl.config import compose
    from llmctl.train import run_in_process

    src, prefix = imported_with_data(tmp_path)  # mistral, vocab 256: no padding columns in the loss
    run_dir = tmp_path / "run"
    cfg = compose(
        str(tmp_path / "mc" / "recipe.yaml"),
        [f"data.prefixes=[{prefix}]", f"train.run_dir={run_dir}", f"train.train_iters={STEPS}",
         "train.global_batch_size=1", "parallel.micro_batch_size=1", "train.eval_interval=0",
         "train.lr=3e-3", "train.min_lr=3e-3",
         f"checkpoint.init_from=hf:{src}"],
    )  # fmt: skip
    result = run_in_process(cfg, run_dir)
    assert (run_dir / "init_from" / "import.json").is_file()  # hf: was imported by the run
    assert result.steps == STEPS
    expected = _hf_loss(src, _first_sample(cfg))
    print(f"measured: step-1 loss {result.losses[0]:.6f}, transformers {expected:.6f}, "
          f"last 3 {result.losses[-3:]}")  # fmt: skip
    assert result.losses[0] == pytest.approx(expected, abs=1e-4)
    assert sum(result.losses[-3:]) / 3 < result.losses[0] - 0.5, result.losses


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "launch"])
def test_init_from_model_mismatch_is_refused_before_any_rank(
    dry_run: bool,
    tmp_path: Path,
    run_main: Callable[[list[str]], tuple[int, str, str]],
) -> None:
    """A source whose model differs from the recipe's (hidden size, vocabulary) is one line,
    exit code 2, naming the field and both values, before the run directory or any rank
    exists; the matching recipe passes the same check."""
    from hf_support import make_model
    from typer.testing import CliRunner

    from llmctl.cli.main import app

    src = make_model("qwen2", tmp_path / "hf")
    res = CliRunner().invoke(app, ["import", "hf", str(src), "--out", str(tmp_path / "mc")])
    assert res.exit_code == 0, res.output
    ckpt = tmp_path / "mc" / "checkpoints" / "iter_0000000"
    run_dir = tmp_path / "run"
    base = ["train", f"recipe={tmp_path / 'mc' / 'recipe.yaml'}", f"train.run_dir={run_dir}"]
    base += ["--dry-run"] if dry_run else []
    cases = [  # (init_from, override, field, the source's value, this run's)
        (str(tmp_path / "mc"), "model.hidden_size=128", "hidden_size", 64, 128),
        (f"hf:{src}", "model.vocab_size=512", "vocab_size", 256, 512),
    ]
    for source, override, name, saved, have in cases:
        argv = [*base, override, f"checkpoint.init_from={source}"]
        code, stdout, stderr = run_main(argv)
        assert code == 2 and stdout == "", stderr
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        named = ckpt if not source.startswith("hf:") else src
        assert lines == [
            f"error: checkpoint.init_from={named} holds a model with model.{name}={saved}, "
            f"this run has {have}; use the recipe.yaml or model.yaml that `llmctl import hf` wrote"
        ], stderr
        assert not run_dir.exists()
    if dry_run:
        code, _, stderr = run_main([*base, f"checkpoint.init_from=hf:{src}"])
        assert code == 0, stderr
