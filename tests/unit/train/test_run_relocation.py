"""Run directories work from any directory and after being moved.

A run is created from a working directory with relative data and tokenizer paths (as a user
types them), trained for real in this process, moved elsewhere, and then resumed, exported
(`llmctl export hf`, read back by transformers) and planned for quantization from another cwd.
The data is preprocessed here with a relative tokenizer path, which its manifest records as
typed, and the run is created without `data.tokenizer`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmctl.cli.main import app

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow  # trains, preprocesses and exports for real: ~20 s


def _train_here(cfg, run_dir: Path):
    import torch

    from llmctl.run.rundir import create_run_dir
    from llmctl.train import run_in_process

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        create_run_dir(cfg, None)
        return run_in_process(cfg, run_dir)
    finally:
        torch.set_num_threads(threads)


def test_a_moved_run_resumes_exports_and_quantizes_from_anywhere(
    demo_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmctl.data.demo import prepare_demo_data
    from llmctl.launch.api import prepare_train
    from llmctl.launch.ckpt_resume import prepare_resume

    prepare_demo_data(demo_cache)
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    shutil.copy(demo_cache / "tokenizer" / "tokenizer.json", work / "data" / "tokenizer.json")
    monkeypatch.chdir(work)
    res = CliRunner().invoke(
        app, ["data", "preprocess", str(demo_cache / "dedup" / "corpus.jsonl"),
              "--tokenizer", "data/tokenizer.json", "--output-prefix", "data/demo"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output  # the manifest records data/tokenizer.json, relative
    launch = prepare_train(
        "tiny_cpu",
        ["data.prefixes=[data/demo]", "train.run_dir=run", "data.cache_dir=cache",
         "train.train_iters=2", "train.eval_interval=0", "checkpoint.interval=2",
         "checkpoint.async_save=false"],
    )  # fmt: skip
    _train_here(launch.cfg, launch.run_dir)
    saved = yaml.safe_load((work / "run" / "config.yaml").read_text())
    assert saved["data"]["prefixes"] == [str(work / "data" / "demo")]
    assert saved["data"]["tokenizer"] == str(work / "data" / "tokenizer.json")

    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(work / "run", moved)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")

    resumed = prepare_resume(moved, ["train.train_iters=4"])
    assert resumed.resume_point.step == 2 and resumed.run_dir == moved
    result = _train_here(resumed.cfg, moved)
    assert result.steps == 4 and len(result.losses) == 2  # steps 3 and 4 only

    runner = CliRunner()
    res = runner.invoke(app, ["export", "hf", str(moved), "--out", "hf", "--json"])
    assert res.exit_code == 0, res.output
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained("hf").hidden_size == 64
    assert AutoTokenizer.from_pretrained("hf")("def f():")["input_ids"]
    res = runner.invoke(
        app, ["quantize", str(moved), "--preset", "w8a16_rtn", "--group-size", "64", "--out", "q",
              "--dry-run", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert str(work / "data" / "demo") in json.dumps(json.loads(res.output))
