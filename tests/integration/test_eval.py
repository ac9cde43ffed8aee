"""`llmctl eval` against its oracles: lm-evaluation-harness's own command line and transformers.

- The task numbers of `llmctl eval DIR` equal those of `python -m lm_eval --model hf
  --model_args pretrained=DIR,dtype=float32 --tasks llmctl_arith --include_path TASKS` run
  directly on the same directory and task files (identical floats).
- llmctl's perplexity equals transformers' own loss (labels=) on the same tokens, tokenized
  here with the `tokenizers` library, within 1e-5 relative.
- `--vs` gives each model the numbers a separate run gives it, and OTHER - SOURCE as deltas.

Two tiny Llamas made here with transformers (different seeds), with a BPE tokenizer trained on
text that holds the task's digits (so every choice is real tokens, not `<unk>`). One `llmctl
eval A --vs B` run is shared by the asserts (module fixture): the harness starts slowly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eval_support import TEXT, make_llama, transformers_perplexity
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # lm_eval: slow start


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    held = root / "held.jsonl"
    docs = [
        " ".join(TEXT[(i + j) % 4] for j in range(3)) + f" {i} + {i} = {2 * i}" for i in range(30)
    ]
    held.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return {"a": make_llama(root / "a", 0), "b": make_llama(root / "b", 1), "held": held,
            "root": root}  # fmt: skip


def _eval_json(*args: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["eval", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def report(models: dict[str, Path]) -> dict[str, Any]:
    """One `llmctl eval A --vs B` run, shared by the asserts."""
    return _eval_json(str(models["a"]), "--vs", str(models["b"]), "--data", str(models["held"]))


def _lm_eval_argv(model_dir: Path, tasks_dir: Path) -> list[str]:
    """`python -m lm_eval` on the directory, as the harness's docs say to run it offline."""
    return ["python", "-m", "lm_eval", "--model", "hf", "--model_args",
            f"pretrained={model_dir},dtype=float32", "--tasks", "llmctl_arith", "--device", "cpu",
            "--batch_size", "1", "--include_path", str(tasks_dir)]  # fmt: skip


def test_task_numbers_equal_lm_eval_run_directly(models: dict[str, Path], report: dict) -> None:
    tasks_dir = models["root"] / "tasks"
    plan = _eval_json(str(models["a"]), "--dry-run", "--write-tasks", str(tasks_dir))
    argv = _lm_eval_argv(models["a"].resolve(), tasks_dir.resolve())
    assert plan["lm_eval"][0] == " ".join(argv)  # the command --dry-run shows is this one
    assert (tasks_dir / "llmctl_arith.yaml").is_file()
    out = models["root"] / "lm_eval_out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    argv = [sys.executable, *argv[1:], "--output_path", str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = out.rglob("results_*.json")
    direct = json.loads(path.read_text())["results"]["llmctl_arith"]
    ours = report["models"][0]["tasks"]["llmctl_arith"]
    assert direct["sample_len"] == 100
    for metric in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr"):
        assert ours[metric] == direct[f"{metric},none"], metric
    assert 0.0 < ours["acc"] < 1.0  # a real choice was made: not all ties on <unk>


def test_perplexity_equals_transformers(models: dict[str, Path], report: dict) -> None:
    for key, ours in zip("ab", report["models"], strict=True):
        assert ours["seq_len"] == 64  # --seq-len 512 capped at max_position_embeddings
        assert ours["perplexity_windows"] >= 4
        ref = transformers_perplexity(models[key], models["held"], 64, 16384)
        assert ours["perplexity"] == pytest.approx(ref, rel=1e-5), key
        assert ours["predicted_tokens"] == ours["perplexity_windows"] * 63


def test_vs_equals_separate_runs(models: dict[str, Path], report: dict) -> None:
    alone = _eval_json(str(models["b"]), "--data", str(models["held"]))["models"][0]
    side = report["models"][1]
    assert side["tasks"] == alone["tasks"]
    assert side["perplexity"] == alone["perplexity"]
    first = report["models"][0]
    assert first["tasks"] != side["tasks"] or first["perplexity"] != side["perplexity"]
    deltas = report["deltas"]
    assert deltas["perplexity"] == side["perplexity"] - first["perplexity"]
    acc = side["tasks"]["llmctl_arith"]["acc"] - first["tasks"]["llmctl_arith"]["acc"]
    assert deltas["tasks"]["llmctl_arith"]["acc"] == acc


def test_table_shows_both_models_and_deltas(report: dict, capsys: Any) -> None:
    from llmctl.cli.eval import _render

    _render(report)
    out = capsys.readouterr().out
    delta = report["deltas"]["perplexity"]
    assert "llmctl_arith acc" in out and "perplexity" in out and f"{delta:+.4f}" in out
    for m in report["models"]:
        assert f"{m['perplexity']:.4f}" in out


def test_dry_run_names_the_harness_command(models: dict[str, Path]) -> None:
    res = CliRunner().invoke(app, ["eval", str(models["a"]), "--vs", str(models["b"]), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "python -m lm_eval --model hf" in res.output
    assert f"pretrained={models['b'].resolve()},dtype=float32" in res.output.replace("\n", "")
