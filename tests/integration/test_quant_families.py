"""`llmctl quantize` on every family `llmctl export hf` writes besides Llama: Mistral, Qwen2
(Q/K/V biases, tied embeddings) and Mixtral (MoE experts), from a Hugging Face directory and
from an imported run directory.

Oracles: transformers loads each output with no missing or unexpected tensor (a Mixtral whose
experts it cannot read is reported missing and initialised at random), keeps the architecture,
runs it in the dtype the output declares, and its next-token distributions stay close to the
fp32 source's (mean per-token KL). The models are random (hf_support: made here with
transformers from a config), so the KL bound holds whatever CPU kernels compute them: the
measured values are 8x or more below it under ATEN_CPU_CAPABILITY=default, avx2 and avx512
(docs/quantize.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llmcompressor")

from hf_support import COMMON, TEXT, make_model
from quant_support import mean_token_kl

from llmctl.quant.calibration import load_tokens
from llmctl.quant.quantize import quantize_source

pytestmark = pytest.mark.slow

SEQ, SAMPLES, EVAL = 64, 8, 1024
KL_MAX = 0.005  # nats per token; measured 7.6e-5 .. 5.9e-4 (W4A16 group 32, 3 CPU kinds)
EXPECTED_ARCH = {
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """2 shared cores: torch's default 2 threads oversubscribe."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qfam") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT * 4))
    return path


def _num_linears(family: str) -> int:
    """Quantized Linears: 4 attention projections + 3 MLP ones per expert (lm_head ignored)."""
    experts = 4 if family == "mixtral" else 1  # hf_support: Mixtral has 4 experts
    return COMMON["num_hidden_layers"] * (4 + 3 * experts)


def _check_output(src: Path, out: Path, family: str, docs: Path) -> float:
    """transformers reads every tensor; returns the KL of the output to the fp32 source."""
    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [EXPECTED_ARCH[family]]
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    model, info = AutoModelForCausalLM.from_pretrained(  # eager: torch's bf16 SDPA needs
        str(out), dtype="auto", output_loading_info=True, attn_implementation="eager"
    )  # AVX-512 kernels once ATEN_CPU_CAPABILITY is lowered below the host's
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = torch.arange(3, 3 + SEQ)[None]
    with torch.no_grad():  # the output's own dtype (bf16), as a user loads it
        assert torch.isfinite(model(input_ids=ids).logits).all()
    del model
    tokens = np.asarray(load_tokens(docs, src / "tokenizer.json"))[-EVAL:]
    return mean_token_kl(src, out, tokens, SEQ)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "mixtral"])
def test_gptq_each_family_loads_in_transformers_close_to_fp32(
    family: str, docs: Path, tmp_path: Path
) -> None:
    src = make_model(family, tmp_path / "hf")
    out = tmp_path / "q"
    args = {
        "preset": "w4a16_gptq", "data": str(docs), "num_samples": SAMPLES, "seq_len": SEQ,
        "num_eval_tokens": EVAL,
    }  # fmt: skip
    plan = quantize_source(src, out, dry_run=True, **args).as_dict()  # type: ignore[arg-type]
    assert plan["num_quantized_linears"] == _num_linears(family)  # routers are not Linears
    report = quantize_source(src, out, **args).as_dict()  # type: ignore[arg-type]
    assert report["num_quantized_linears"] == _num_linears(family)
    assert report["group_size"] == 32  # fitted: 64 and 96 inputs
    kl = _check_output(src, out, family, docs)
    print(f"{family}: KL {kl:.3e}, perplexity {report['perplexity_change_pct']:+.3f} %")
    assert 0.0 < kl < KL_MAX


def test_imported_mixtral_run_quantizes(docs: Path, tmp_path: Path) -> None:
    """The run-directory path: export (experts w1/w3/w2) then quantize, RTN."""
    from typer.testing import CliRunner

    from llmctl.cli.main import app

    src = make_model("mixtral", tmp_path / "hf")
    res = CliRunner().invoke(app, ["import", "hf", str(src), "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "q"
    args = {"scheme": "W4A16", "algorithm": "rtn", "data": str(docs), "num_eval_tokens": EVAL}
    plan = quantize_source(tmp_path / "run", out, dry_run=True, **args).as_dict()  # type: ignore[arg-type]
    assert plan["num_quantized_linears"] == _num_linears("mixtral")  # planned from the config
    report = quantize_source(tmp_path / "run", out, **args).as_dict()  # type: ignore[arg-type]
    assert report["num_quantized_linears"] == _num_linears("mixtral")  # counted in the output
    kl = _check_output(src, out, "mixtral", docs)
    print(f"mixtral run dir RTN: KL {kl:.3e}")
    assert 0.0 < kl < KL_MAX
