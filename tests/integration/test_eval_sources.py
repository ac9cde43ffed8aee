"""`llmctl eval` on the other two kinds of source: a run directory and a quantized output.

- A run directory (here: `llmctl import hf` of a model, a megatron-core checkpoint) is exported
  on the fly; import -> export is bit-exact, so its task numbers and perplexity equal the
  source model's exactly, and the temporary export is gone afterwards.
- A `llmctl quantize` output (compressed-tensors, W8A16 RTN) loads in the harness's `hf` model
  on CPU (transformers decompresses it); its perplexity equals transformers' own loss on the
  decompressed fp32 model within 1e-5 relative.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from eval_support import make_llama, transformers_perplexity
from typer.testing import CliRunner

from llmctl.cli.main import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # lm_eval: slow start


def _ok(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval_sources")
    hf = make_llama(root / "hf", 3)
    held = root / "held.jsonl"
    docs = [f"the quick brown fox {i} + {i} = {2 * i} jumps over the lazy dog" for i in range(40)]
    held.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    _ok("import", "hf", str(hf), "--out", str(root / "run"))
    _ok("quantize", str(hf), "-o", str(root / "q"), "--preset", "w8a16_rtn")
    return {"hf": hf, "run": root / "run", "q": root / "q", "held": held}


@pytest.fixture(scope="module")
def report(sources: dict[str, Path]) -> dict[str, Any]:
    before = set(Path(tempfile.gettempdir()).glob("llmctl-eval-*"))
    out = _ok("eval", str(sources["run"]), "--vs", str(sources["q"]),
              "--data", str(sources["held"]), "--json")  # fmt: skip
    assert set(Path(tempfile.gettempdir()).glob("llmctl-eval-*")) == before  # export removed
    return json.loads(out)


def test_run_dir_equals_its_source_model(sources: dict[str, Path], report: dict) -> None:
    run = report["models"][0]
    assert run["kind"] == "run_dir" and run["step"] == 0
    direct = json.loads(_ok("eval", str(sources["hf"]), "--data", str(sources["held"]), "--json"))
    hf = direct["models"][0]
    assert run["tasks"] == hf["tasks"]
    assert run["perplexity"] == hf["perplexity"]


def test_quantized_output_loads_and_scores(sources: dict[str, Path], report: dict) -> None:
    q = report["models"][1]
    assert q["kind"] == "quantized" and q["quantization"] == "pack-quantized"
    ref = transformers_perplexity(sources["q"], sources["held"], q["seq_len"], 16384)
    assert q["perplexity"] == pytest.approx(ref, rel=1e-5)
    assert 0.0 <= q["tasks"]["llmctl_arith"]["acc"] <= 1.0
    # 8-bit weights: close to the fp32 model, not equal to it
    fp = report["models"][0]["perplexity"]
    assert q["perplexity"] != fp and abs(q["perplexity"] / fp - 1) < 0.05
    assert report["deltas"]["perplexity"] == q["perplexity"] - fp
