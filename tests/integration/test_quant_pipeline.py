"""`llmctl quantize` on a Hugging Face directory, checked against the compressed-tensors format
specification and against transformers reloading each output.

The format expectations below are written from the compressed-tensors specification (docs and
`compressed_tensors` source: pack-quantized packs eight 4-bit values per int32 along the input
dimension; group strategy keeps one scale per `group_size` inputs of each row; symmetric means
no zero point), not from llmctl's writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llmcompressor")

from quant_support import (
    FFN,
    HIDDEN,
    build_data,
    corpus,
    mean_token_kl,
    reference_perplexity,
    train_llama,
)

from llmctl.quant.calibration import open_tokens
from llmctl.quant.quantize import quantize_source

pytestmark = pytest.mark.slow

NUM_SAMPLES, SEQ_LEN, EVAL_TOKENS = 64, 256, 8192  # llmctl's calibration defaults
LINEAR_SHAPES = {  # (out, in) of layer 0's Linears in the tiny model (head_dim 32, 2 KV heads)
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (64, HIDDEN),
    "self_attn.v_proj": (64, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (FFN, HIDDEN),
    "mlp.up_proj": (FFN, HIDDEN),
    "mlp.down_proj": (HIDDEN, FFN),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """2 cores shared by every helper's tests: torch's 2 threads oversubscribe (10x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    root = tmp_path_factory.mktemp("quant")
    tok_json, prefix = build_data(root)
    model_dir = train_llama(root, tok_json, prefix)
    tokens = open_tokens(prefix)
    return {"root": root, "model": model_dir, "prefix": prefix, "heldout": tokens[-EVAL_TOKENS:]}


def _run(tiny: dict, name: str, **overrides: object) -> tuple[Path, dict]:
    out = Path(tiny["root"]) / name  # type: ignore[arg-type]
    overrides = {
        "num_calibration_samples": NUM_SAMPLES,
        "calibration_seq_length": SEQ_LEN,
        **overrides,
    }
    report = quantize_source(
        Path(tiny["model"]),  # type: ignore[arg-type]
        out,
        overrides=overrides,
        data=str(tiny["prefix"]),
        num_eval_tokens=EVAL_TOKENS,
    ).as_dict()
    print(
        f"{name}: perplexity {report['perplexity_before']:.4f} -> "
        f"{report['perplexity_after']:.4f} ({report['perplexity_change_pct']:+.3f} %)"
    )
    return out, report


def _tensor(model_dir: Path, name: str) -> list[int]:
    from safetensors import safe_open

    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return f.get_tensor(name).tolist()
    raise KeyError(name)


def _headers(model_dir: Path) -> dict[str, dict]:
    """dtype/shape of every tensor from the raw safetensors header (8-byte length + JSON)."""
    out: dict[str, dict] = {}
    for path in model_dir.glob("*.safetensors"):
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            out.update({k: v for k, v in json.loads(f.read(size)).items() if k != "__metadata__"})
    return out


def _check_reload(tiny: dict, out: Path, report: dict) -> None:
    ppl = reference_perplexity(out, np.asarray(tiny["heldout"]), SEQ_LEN)
    assert ppl == pytest.approx(report["perplexity_after"], rel=1e-4)
    base = reference_perplexity(Path(tiny["model"]), np.asarray(tiny["heldout"]), SEQ_LEN)
    assert base == pytest.approx(report["perplexity_before"], rel=1e-5)
    assert report["perplexity_before"] < 150  # trained: far below the 512-token vocabulary


def test_w4a16_gptq_matches_spec_and_reloads(tiny: dict) -> None:
    out, report = _run(tiny, "w4a16_gptq", scheme="W4A16", algorithm="gptq", group_size=128)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == "pack-quantized"
    assert qc["quantization_status"] == "compressed"
    assert qc["ignore"] == ["lm_head"]
    (group,) = qc["config_groups"].values()
    assert group["targets"] == ["Linear"]
    assert group["input_activations"] is None
    w = group["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"]) == (4, "int", "group", 128)
    assert w["symmetric"] is True and w["dynamic"] is False

    heads = _headers(out)
    for name, (rows, cols) in LINEAR_SHAPES.items():
        p = f"model.layers.0.{name}"
        assert heads[f"{p}.weight_packed"]["dtype"] == "I32"
        assert heads[f"{p}.weight_packed"]["shape"] == [rows, cols // 8]
        assert heads[f"{p}.weight_scale"]["shape"] == [rows, cols // 128]
        assert heads[f"{p}.weight_scale"]["dtype"] == "BF16"
        assert f"{p}.weight_zero_point" not in heads and f"{p}.weight" not in heads
    assert _tensor(out, "model.layers.0.mlp.down_proj.weight_shape") == [HIDDEN, FFN]
    assert heads["lm_head.weight"]["shape"] == [512, HIDDEN]  # ignored: dense

    # bits per weight from the spec: 4 bits + one bf16 scale per 128 weights
    assert report["bits_per_weight"] == pytest.approx(4 + 16 / 128)
    assert report["theoretical_bits_per_weight"] == pytest.approx(4.125)
    assert json.loads((out / "quant_report.json").read_text())["out"] == str(out)
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    _check_reload(tiny, out, report)
    assert report["perplexity_change_pct"] < 2.0


# KL(GPTQ) / KL(RTN) measured 0.235-0.265 under ATEN_CPU_CAPABILITY=default, avx2 and avx512
# (g128 and per channel; docs/benchmarks.md, "Quantization"), where the trained weights and the
# perplexity ordering both change: the bound leaves more than 2x room for other CPUs.
GPTQ_KL_RATIO_BOUND = 0.6


@pytest.mark.parametrize("group_size", [128, 0])
def test_gptq_closer_to_source_than_rtn(tiny: dict, group_size: int) -> None:
    """GPTQ's promise is fidelity to the source model, not a lower perplexity on some text
    (RTN's noise can lower perplexity on an out-of-distribution tail, and which way it goes
    depends on the trained weights, which depend on the CPU's kernels). The oracle is
    transformers reloading each output and torch's log-softmax: mean per-token KL to fp32."""
    rtn_out, rtn = _run(
        tiny, f"rtn_{group_size}", scheme="W4A16", algorithm="rtn", group_size=group_size
    )
    gptq_out, gptq = _run(
        tiny, f"gptq_{group_size}", scheme="W4A16", algorithm="gptq", group_size=group_size
    )
    assert gptq["perplexity_before"] == rtn["perplexity_before"]
    heldout = np.asarray(tiny["heldout"])
    kl_rtn = mean_token_kl(Path(tiny["model"]), rtn_out, heldout, SEQ_LEN)  # type: ignore[arg-type]
    kl_gptq = mean_token_kl(Path(tiny["model"]), gptq_out, heldout, SEQ_LEN)  # type: ignore[arg-type]
    print(
        f"KL to fp32, g{group_size}: rtn {kl_rtn:.6f} gptq {kl_gptq:.6f} "
        f"ratio {kl_gptq / kl_rtn:.3f}; ppl rtn {rtn['perplexity_after']:.4f} "
        f"gptq {gptq['perplexity_after']:.4f} base {rtn['perplexity_before']:.4f}"
    )
    assert 0 < kl_gptq < GPTQ_KL_RATIO_BOUND * kl_rtn


@pytest.mark.parametrize(
    ("scheme", "algorithm", "fmt", "weight_dtype", "scale_cols"),
    [
        ("W8A16", "rtn", "pack-quantized", "I32", HIDDEN // 128),
        ("W8A8", "gptq", "int-quantized", "I8", 1),
        ("FP8_DYNAMIC", "rtn", "float-quantized", "F8_E4M3", 1),
    ],
)
def test_schemes_match_spec_and_reload(
    tiny: dict, scheme: str, algorithm: str, fmt: str, weight_dtype: str, scale_cols: int
) -> None:
    out, report = _run(tiny, f"{scheme}_{algorithm}", scheme=scheme, algorithm=algorithm)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == fmt
    (group,) = qc["config_groups"].values()
    assert group["weights"]["num_bits"] == 8
    heads = _headers(out)
    p = "model.layers.0.self_attn.q_proj"
    stored = heads.get(f"{p}.weight_packed") or heads[f"{p}.weight"]
    assert stored["dtype"] == weight_dtype
    cols = HIDDEN // 4 if weight_dtype == "I32" else HIDDEN  # four 8-bit values per int32
    assert stored["shape"] == [HIDDEN, cols]
    assert heads[f"{p}.weight_scale"]["shape"] == [HIDDEN, scale_cols]
    if scheme in ("W8A8", "FP8_DYNAMIC"):  # activations quantized per token at run time
        acts = group["input_activations"]
        assert acts["dynamic"] is True and acts["strategy"] == "token"
        rows = sum(r for r, _ in LINEAR_SHAPES.values())  # one bf16 scale per output row
        weights = sum(r * c for r, c in LINEAR_SHAPES.values())
        assert report["bits_per_weight"] == pytest.approx(8 + 16 * rows / weights, abs=1e-4)
    else:
        assert report["bits_per_weight"] == pytest.approx(8.125)
        assert report["perplexity_change_pct"] < 0.5
    _check_reload(tiny, out, report)


def test_interrupted_run_leaves_nothing(tiny: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import llmctl.quant.quantize as q

    def interrupted(*args: object, **kwargs: object) -> None:
        os.write(2, b"third-party words before the interrupt\n")  # as a library's warning
        raise KeyboardInterrupt

    monkeypatch.setattr(q, "run_oneshot", interrupted)
    out = Path(tiny["root"]) / "interrupted"  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        _run(tiny, "interrupted", scheme="W8A16", algorithm="rtn")
    assert not out.exists()
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(".interrupted")]
    assert left == [".interrupted.quantize.log"]  # third-party output, kept for the post-mortem
    log = (out.parent / ".interrupted.quantize.log").read_text()
    assert "third-party words before the interrupt" in log


def test_cli_json_is_the_only_stdout(tiny: dict) -> None:
    """A real `llmctl quantize --json` process: stdout parses as JSON (llm-compressor logs to
    stdout unless silenced), and the table it describes is the saved report. stderr carries
    llmctl's own phases with an ETA, and no third-party warning or progress bar: those are in
    OUT/quantize.log (transformers' false "offloaded modules" warning among them)."""
    import subprocess
    import sys

    out = Path(tiny["root"]) / "cli_w8a16"  # type: ignore[arg-type]
    argv = [
        sys.executable, "-m", "llmctl", "quantize", str(tiny["model"]), "--out", str(out),
        "--preset", "w8a16_rtn", "--data", str(tiny["prefix"]), "--seq-len", str(SEQ_LEN),
        "--eval-tokens", str(EVAL_TOKENS), "--json",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LLMCTL_PROGRESS": "1"}  # stderr is a pipe
    env.pop("LLMCTL_VERBOSE", None)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report == json.loads((out / "quant_report.json").read_text())
    assert report["scheme"] == "W8A16" and report["bits_per_weight"] == pytest.approx(8.125)
    for phase in ("load fp32 model", "perplexity before", "save compressed", "perplexity after"):
        assert phase in proc.stderr, proc.stderr
    assert "ETA" in proc.stderr
    for noise in ("Warning", "warn(", "%|", "Compressing model", "offloaded"):
        assert noise not in proc.stderr, proc.stderr
    assert "offloaded modules" in (out / "quantize.log").read_text()


def test_killed_process_leaves_no_complete_looking_output(tiny: dict) -> None:
    """SIGKILL a real `llmctl quantize` once it has started writing: `--out` never appears."""
    import signal
    import subprocess
    import sys
    import time

    root = Path(tiny["root"])  # type: ignore[arg-type]
    out = root / "killed"
    argv = [
        sys.executable, "-m", "llmctl", "quantize", str(tiny["model"]), "--out", str(out),
        "--preset", "w4a16_gptq", "--data", str(tiny["prefix"]),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(root.glob(".killed.partial-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, "quantize finished before it could be killed"
        time.sleep(0.05)
    time.sleep(0.5)  # let it get into the work
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()
    leftovers = list(root.glob(".killed.partial-*"))
    assert leftovers and all(not (p / "quant_report.json").exists() for p in leftovers)


def test_text_data_and_no_data(tiny: dict, tmp_path: Path) -> None:
    """A third-party-style model scored on plain JSONL with its own tokenizer: the perplexity
    equals transformers' on the tokens HF tokenizers makes of that file. RTN/FP8 run without
    any data (nothing to score: said, not invented)."""
    from tokenizers import Tokenizer

    texts = corpus()[-60:]
    jsonl = tmp_path / "heldout.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = Path(tiny["model"])  # type: ignore[arg-type]
    report = quantize_source(
        model, tmp_path / "w8_text", scheme="W8A16", algorithm="rtn", data=str(jsonl),
        seq_len=SEQ_LEN, num_eval_tokens=4 * SEQ_LEN,
    ).as_dict()  # fmt: skip
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    eos = tok.token_to_id(json.loads((model / "tokenizer_config.json").read_text())["eos_token"])
    ids = np.asarray([i for t in texts for i in (*tok.encode(t).ids, eos)])
    base = reference_perplexity(model, ids[-4 * SEQ_LEN :], SEQ_LEN)
    assert report["perplexity_before"] == pytest.approx(base, rel=1e-5)
    assert report["num_eval_tokens"] == 4 * SEQ_LEN

    fp8 = quantize_source(model, tmp_path / "fp8_nodata", preset="fp8_dynamic").as_dict()
    assert fp8["perplexity_before"] is None and fp8["perplexity_after"] is None
    assert fp8["num_eval_tokens"] == 0 and "perplexity not scored" in fp8["notes"][-1]
    assert (tmp_path / "fp8_nodata" / "quant_report.json").is_file()
