"""`llmctl quantize`: bad input fails before any heavy work, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from quant_fakes import write_data, write_hf_dir
from typer.testing import CliRunner

from llmctl.cli.main import app

runner = CliRunner()


def _quantize(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["quantize", *args], env={"COLUMNS": "400"})
    return res.exit_code, res.output


def test_dry_run_plans_without_writing(hf_dir: Path, data: str, tmp_path: Path) -> None:
    out = tmp_path / "q"
    code, text = _quantize(str(hf_dir), "--out", str(out), "--data", data, "--dry-run", "--json")
    assert code == 0, text
    plan = json.loads(text)
    assert plan["scheme"] == "W4A16" and plan["group_size"] == 128
    assert plan["num_quantized_linears"] == 7  # lm_head ignored
    assert plan["theoretical_bits_per_weight"] == 4.125
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "W4A16 gptq calibrates on data: pass --data"),
        (["--group-size", "96", "--data", "DATA"], "group size 96 does not divide"),
        (["--scheme", "W5A16", "--data", "DATA"], "Invalid value for '--scheme'"),
        (["--preset", "nope", "--data", "DATA"], "Invalid value for '--preset'"),
        (["--preset", "nope.yaml", "--data", "DATA"], "unknown quantization preset"),
        (["--algorithm", "gptq", "--scheme", "FP8_DYNAMIC", "--data", "DATA"], "cannot produce"),
        (["--data", "DATA", "--num-samples", "1000"], "lower --num-samples"),
        (
            ["--ignore", "model.layers.0.mlp.down_prj", "--data", "DATA"],
            "--ignore 'model.layers.0.mlp.down_prj' matches no Linear module of the model",
        ),
        (["--ignore", "re:[", "--data", "DATA"], "ignore entry 're:[': not a valid regular"),
        (["--tokenizer", "nope.json", "--data", "DATA"], "--tokenizer nope.json not found"),
    ],
)
def test_bad_requests_exit_2(
    hf_dir: Path, data: str, tmp_path: Path, extra: list[str], message: str
) -> None:
    args = [a.replace("DATA", data) for a in extra]
    code, text = _quantize(str(hf_dir), "--out", str(tmp_path / "q"), *args)
    assert code == 2 and message in " ".join(text.split()), text
    assert not (tmp_path / "q").exists()


def test_data_from_another_tokenizer_is_refused(hf_dir: Path, tmp_path: Path) -> None:
    foreign = write_data(tmp_path / "foreign_text_document", high=5000)
    code, text = _quantize(str(hf_dir), "--out", str(tmp_path / "q"), "--data", foreign)
    assert code == 2 and "different tokenizer" in text


def test_unsupported_architecture_and_existing_output(tmp_path: Path, data: str) -> None:
    gpt2 = write_hf_dir(tmp_path / "gpt2", arch="GPT2LMHeadModel")
    code, text = _quantize(str(gpt2), "--out", str(tmp_path / "q"), "--data", data)
    assert code == 2 and "architecture GPT2LMHeadModel is not supported" in text
    llama = write_hf_dir(tmp_path / "llama")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("keep me")
    code, text = _quantize(str(llama), "--out", str(tmp_path / "taken"), "--data", data)
    assert code == 2 and "exists; pass --force" in text
    assert (tmp_path / "taken" / "x").read_text() == "keep me"


def test_awq_needs_cuda(hf_dir: Path, data: str, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: AWQ is allowed")
    code, text = _quantize(
        str(hf_dir), "--out", str(tmp_path / "q"), "--data", data, "--algorithm", "awq"
    )
    assert code == 2 and "needs a CUDA device" in text


def test_ignore_adds_to_the_preset_and_unblocks_a_module(tmp_path: Path, data: str) -> None:
    odd = write_hf_dir(tmp_path / "odd", ffn=192)  # down_proj input 192: not a multiple of 128
    args = [str(odd), "--out", str(tmp_path / "q"), "--data", data, "--dry-run", "--json"]
    code, text = _quantize(*args, "--group-size", "128")
    assert code == 2 and "model.layers.0.mlp.down_proj (192)" in text
    code, text = _quantize(*args, "--group-size", "128", "--ignore", "re:.*down_proj$")
    assert code == 0, text
    plan = json.loads(text)
    assert plan["ignore"] == ["lm_head", "re:.*down_proj$"]
    assert plan["num_quantized_linears"] == 6


def test_group_size_fits_the_model_or_the_error_lists_every_module(
    tmp_path: Path, data: str
) -> None:
    """The preset's group 128 does not divide a 192-wide FFN: llmctl picks 64 and says so; an
    explicit --group-size that does not divide is refused naming every offending module."""
    odd = write_hf_dir(tmp_path / "odd", ffn=192, layers=2)
    args = [str(odd), "--out", str(tmp_path / "q"), "--data", data, "--dry-run", "--json"]
    code, text = _quantize(*args)
    assert code == 0, text
    plan = json.loads(text)
    assert plan["group_size"] == 64 and "using group size 64" in plan["notes"][0]
    code, text = _quantize(*args, "--group-size", "128")
    flat = " ".join(text.split())
    assert code == 2 and "2 module(s)" in flat and "--group-size 64" in flat
    for layer in (0, 1):
        assert f"model.layers.{layer}.mlp.down_proj (192)" in flat


def test_rtn_and_fp8_need_no_data(hf_dir: Path, tmp_path: Path) -> None:
    for preset in ("w8a16_rtn", "fp8_dynamic"):
        args = [str(hf_dir), "--out", str(tmp_path / "q"), "--preset", preset]
        code, text = _quantize(*args, "--dry-run", "--json")
        assert code == 0, text
        plan = json.loads(text)
        assert plan["data"] is None and plan["num_eval_tokens"] == 0
        assert "perplexity not scored" in plan["notes"][-1]


def test_text_data_is_tokenized_with_the_models_tokenizer(hf_dir: Path, tmp_path: Path) -> None:
    """A JSONL file is read with the model directory's own tokenizer; a bad line is named."""
    from tokenizers import Tokenizer

    texts = [f"def g{i}(y):\n    return y * {i}\n" * 30 for i in range(60)]
    jsonl = tmp_path / "eval.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    args = [str(hf_dir), "--out", str(tmp_path / "q"), "--preset", "w8a16_rtn", "--dry-run"]
    code, text = _quantize(*args, "--data", str(jsonl), "--eval-tokens", "1024", "--json")
    assert code == 0, text
    assert json.loads(text)["data"] == str(jsonl)
    from llmctl.quant.calibration import text_tokens

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))  # the oracle: HF tokenizers
    eos = tok.token_to_id(json.loads((hf_dir / "tokenizer_config.json").read_text())["eos_token"])
    expected = [i for t in texts for i in (*tok.encode(t).ids, eos)]
    assert text_tokens(jsonl, hf_dir).tolist() == expected
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    code, text = _quantize(*args, "--data", str(bad))
    assert code == 2 and f"{bad}:2: expected a JSON object" in " ".join(text.split())


def test_presets_enum_matches_shipped_files() -> None:
    from llmctl.quant.schemes import Preset
    from llmctl.resources import list_options

    assert sorted(p.value for p in Preset) == list_options("quant")


def test_force_never_replaces_what_llmctl_did_not_write(hf_dir: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    args = [str(hf_dir), "--out", str(mine), "--preset", "w8a16_rtn", "--dry-run", "--force"]
    code, text = _quantize(*args)
    assert code == 2 and "not written by llmctl" in text
    assert (mine / "notes.txt").read_text() == "keep me"
    a_file = tmp_path / "model.txt"
    a_file.write_text("keep me too")
    args = [str(hf_dir), "--out", str(a_file), "--preset", "w8a16_rtn", "--dry-run", "--force"]
    code, text = _quantize(*args)
    assert code == 2 and "not written by llmctl" in text
    assert a_file.read_text() == "keep me too"


def test_data_without_tokens_says_so(hf_dir: Path, tmp_path: Path) -> None:
    """An empty file, only empty documents, or an indexed dataset of empty documents is "no
    tokens", one line and exit code 2, not advice to lower --num-samples."""
    import numpy as np

    from llmctl.data.indexed import bin_path, write_index

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n\n{"text": ""}\n')
    (tmp_path / "empty.txt").write_text("")
    prefix = tmp_path / "ds"
    write_index(prefix, np.uint16, [np.zeros(2, np.int64)])  # two empty documents
    bin_path(prefix).write_bytes(b"")
    for data in ("empty.jsonl", "blank.jsonl", "empty.txt", "ds"):
        code, text = _quantize(
            str(hf_dir), "--out", str(tmp_path / "q"), "--data", str(tmp_path / data)
        )
        assert code == 2 and f"data {tmp_path / data} has no tokens" in " ".join(text.split()), text
        assert "--num-samples" not in text and "Traceback" not in text
        assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("scheme: [W4A16\n", "not valid YAML (line 2"),
        ("- scheme\n- W4A16\n", "expected a mapping of quant fields, got a list"),
        ("scheme: W4A16\n\xff\n", "not valid YAML"),
        ("ignore: lm_head\n", "quant.ignore must be a list"),  # was ignore=[l, m, _, h, ...]
        ("group_size: abc\n", "quant.group_size must be an integer, got 'abc'"),
        ("num_calibration_samples: 2.5\n", "quant.num_calibration_samples must be an integer"),
    ],
)
def test_malformed_preset_file_is_one_line(
    hf_dir: Path, data: str, tmp_path: Path, body: str, message: str
) -> None:
    """A preset YAML that does not parse (PyYAML's own error, with its line) or is not a
    mapping is one line naming the file, exit code 2 (was a ParserError / TypeError traceback)."""
    preset = tmp_path / "mine.yaml"
    preset.write_bytes(body.encode("latin-1"))
    code, text = _quantize(str(hf_dir), "--out", str(tmp_path / "q"), "--preset", str(preset),
                           "--data", data, "--dry-run")  # fmt: skip
    flat = " ".join(text.split())
    assert code == 2 and message in flat and "Traceback" not in text, text
    assert message.startswith("quant.") or f"{preset}: {message}" in flat
