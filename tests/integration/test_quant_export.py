"""`llmctl export hf` from a real llmctl training run (megatron-core, CPU, one rank).

Oracle: transformers loads the export and its logits on held-out tokens match the logits of
megatron-core's own GPTModel loaded from the same checkpoint (fp32, max abs diff < 1e-4).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from quant_support import FFN, HIDDEN, SEQ, VOCAB, build_data, megatron_logits
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.errors import UserError
from llmctl.hf.export import export_run
from llmctl.progress import Phase, Progress
from llmctl.quant.calibration import open_tokens

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A llmctl run directory with committed checkpoints at steps 10 and 20."""
    import torch

    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir
    from llmctl.train.checkpoint import make_checkpointer
    from llmctl.train.run import run_in_process

    root = tmp_path_factory.mktemp("export")
    tok_json, prefix = build_data(root)
    run_dir = root / "run"
    cfg = compose(
        "tiny_cpu",
        [
            f"model.hidden_size={HIDDEN}",
            f"model.ffn_hidden_size={FFN}",
            f"model.vocab_size={VOCAB}",
            f"model.seq_length={SEQ}",
            f"data.prefixes=[{prefix}]",
            f"data.tokenizer={tok_json}",
            f"data.cache_dir={root / 'cache'}",
            "checkpoint.interval=10",
            "train.train_iters=20",
            "train.lr=3e-3",
            f"train.run_dir={run_dir}",
        ],
    )
    create_run_dir(cfg, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_in_process(cfg, run_dir, checkpointer=make_checkpointer(cfg, run_dir))
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "run": run_dir, "prefix": prefix, "cfg": cfg}


def test_export_logits_match_megatron(run: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(run["root"]) / "hf"
    result = export_run(Path(run["run"]), out)
    assert result.step == 20 and result.architecture == "LlamaForCausalLM"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_key_value_heads"], config["head_dim"]) == (2, HIDDEN // 4)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in out.glob("*.safetensors")}
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.eos_token == "<|endoftext|>"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id

    tokens = np.asarray(open_tokens(run["prefix"])[-2 * SEQ :], dtype=np.int64).reshape(2, SEQ)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = hf(input_ids=torch.from_numpy(tokens)).logits.numpy()
    ref = megatron_logits(run["cfg"], Path(run["run"]) / "checkpoints" / "iter_0000020", tokens)
    assert np.abs(ref).max() > 1.0  # trained logits, not a near-uniform init
    assert np.abs(hf_logits - ref).max() < 1e-4


def test_export_cli_and_bad_runs(run: dict, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "hf10"
    res = runner.invoke(app, ["export", "hf", str(run["run"]), "--out", str(out), "--step", "10"])
    assert res.exit_code == 0, res.output
    assert (out / "config.json").is_file()
    wide = {"COLUMNS": "400"}  # CliRunner draws errors in an 80-column box otherwise
    again = runner.invoke(app, ["export", "hf", str(run["run"]), "--out", str(out)], env=wide)
    assert again.exit_code == 2 and "exists; pass --force" in again.output
    forced = runner.invoke(
        app, ["export", "hf", str(run["run"]), "-o", str(out), "--force", "--json"],
        env={"LLMCTL_PROGRESS": "1", "COLUMNS": "120"},  # CliRunner's stderr is no terminal
    )  # fmt: skip
    assert forced.exit_code == 0, forced.output  # llmctl's own export: replaced
    assert json.loads(forced.stdout)["step"] == 20  # stdout: the JSON only
    for shown in ("validate checkpoint", "tensors (MiB)", "convert to", "write 1 shard", "ETA"):
        assert shown in forced.stderr, forced.stderr
    assert json.loads((out / "llmctl_export.json").read_text())["step"] == 20
    foreign = tmp_path / "someone_elses_model"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    refused = runner.invoke(
        app, ["export", "hf", str(run["run"]), "-o", str(foreign), "--force"], env=wide
    )
    assert refused.exit_code == 2 and "not written by llmctl" in refused.output
    assert (foreign / "config.json").read_text() == "{}"

    broken = tmp_path / "broken"
    shutil.copytree(run["run"], broken)
    (broken / "checkpoints" / "iter_0000020" / "manifest.json").unlink()
    with pytest.raises(UserError, match=r"manifest.json missing.*--step 10"):
        export_run(broken, tmp_path / "x")
    shutil.rmtree(broken / "checkpoints")
    (broken / "checkpoints").mkdir()
    with pytest.raises(UserError, match="no committed checkpoint"):
        export_run(broken, tmp_path / "x")


def _flip_a_byte(ckpt: Path) -> None:
    """Corrupt a checkpoint in place, keeping every size (only the CRC32s can tell)."""
    shard = sorted(ckpt.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_corrupt_checkpoint_hint_names_a_step_that_is_complete(run: dict, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(run["run"], broken)
    _flip_a_byte(broken / "checkpoints" / "iter_0000020")
    with pytest.raises(UserError) as err:
        export_run(broken, tmp_path / "x")
    assert err.value.message.endswith("checksum mismatch; --step 10 is complete")
    assert export_run(broken, tmp_path / "x10", step=10).step == 10  # the hint holds
    _flip_a_byte(broken / "checkpoints" / "iter_0000010")
    with pytest.raises(UserError) as err:
        export_run(broken, tmp_path / "y")
    assert err.value.message.endswith("checksum mismatch")  # no complete step to offer
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_tokenizer_that_is_no_tokenizer_is_one_line_before_any_weight(
    run: dict, tmp_path: Path
) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"my": "notes"')
    with pytest.raises(UserError) as err:
        export_run(Path(run["run"]), tmp_path / "x", tokenizer=bad)
    assert err.value.message.startswith(f"tokenizer {bad} is not a tokenizer.json (")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]


def test_quantize_run_dir_exports_on_the_fly(run: dict) -> None:
    from llmctl.quant.quantize import quantize_source

    out = Path(run["root"]) / "q8"
    report = quantize_source(
        Path(run["run"]),
        out,
        overrides={"scheme": "W8A16", "algorithm": "rtn", "calibration_seq_length": SEQ},
        num_eval_tokens=4 * SEQ,
    ).as_dict()
    assert report["source"] == str(run["run"])
    assert report["bits_per_weight"] == pytest.approx(8.125)
    assert abs(report["perplexity_change_pct"]) < 0.5
    assert (out / "quant_report.json").is_file() and (out / "tokenizer.json").is_file()
    assert not [p for p in out.parent.iterdir() if p.name.startswith((".q8", ".llmctl-export"))]


def test_gpt_style_run_exports_as_gpt2(tmp_path: Path) -> None:
    """LayerNorm + GeLU + learned positions + biases: GPT2LMHeadModel, same logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmctl.config import compose
    from llmctl.quant.quantize import quantize_source
    from llmctl.run.rundir import create_run_dir
    from llmctl.train.checkpoint import make_checkpointer
    from llmctl.train.run import run_in_process

    tok_json, prefix = build_data(tmp_path)
    run_dir = tmp_path / "gpt"
    cfg = compose(
        "tiny_cpu",
        [
            "model.normalization=layernorm", "model.activation=gelu",
            "model.position_embedding=learned_absolute", "model.num_query_groups=4",
            "model.add_bias_linear=true", f"model.hidden_size={HIDDEN}",
            f"model.vocab_size={VOCAB}", f"model.seq_length={SEQ}",
            f"data.prefixes=[{prefix}]", f"data.tokenizer={tok_json}",
            f"data.cache_dir={tmp_path / 'cache'}", "checkpoint.interval=10",
            "train.train_iters=10", "train.lr=3e-3", f"train.run_dir={run_dir}",
        ],
    )  # fmt: skip
    create_run_dir(cfg, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_in_process(cfg, run_dir, checkpointer=make_checkpointer(cfg, run_dir))
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "hf"
    assert export_run(run_dir, out).architecture == "GPT2LMHeadModel"
    tokens = np.asarray(open_tokens(prefix)[-2 * SEQ :], dtype=np.int64).reshape(2, SEQ)
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    with torch.no_grad():
        got = hf(input_ids=torch.from_numpy(tokens)).logits.numpy()
    ref = megatron_logits(cfg, run_dir / "checkpoints" / "iter_0000010", tokens)
    assert np.abs(got - ref).max() < 1e-4
    with pytest.raises(UserError, match="exports as GPT2LMHeadModel, which llmctl does not"):
        quantize_source(run_dir, tmp_path / "q")


class _Recorder(Progress):
    """Every phase llmctl announces, with the totals and updates it reports (what the console
    bar draws)."""

    def __init__(self) -> None:
        self.phases: dict[str, tuple[int | None, list[int]]] = {}

    @contextmanager
    def phase(self, name: str, total: int | None = None) -> Iterator[Phase]:
        updates: list[int] = []
        self.phases[name] = (total, updates)

        class _P(Phase):
            def advance(self, n: int = 1) -> None:
                updates.append((updates[-1] if updates else 0) + n)

            def update(self, completed: int) -> None:
                updates.append(completed)

        yield _P()


def test_export_progress_is_per_tensor_and_per_shard(run: dict, tmp_path: Path) -> None:
    """Loading advances once per checkpoint tensor and writing once per shard, in MiB, up to
    the total (so the ETA follows the bytes); a small shard limit gives several shards."""
    from megatron.core import dist_checkpointing

    from llmctl.hf.export import MIB, _one_rank_group, export_hf, find_run_checkpoint
    from llmctl.hf.modeldir import read_tensors

    ckpt = find_run_checkpoint(run["run"], None, None)  # type: ignore[arg-type]
    with _one_rank_group():
        keys = [k for k in dist_checkpointing.load_tensors_metadata(str(ckpt.path)) if
                k.startswith(("embedding", "decoder", "output_layer"))]  # fmt: skip
    recorder = _Recorder()
    result = export_hf(ckpt, tmp_path / "hf", max_shard_bytes=MIB // 2, progress=recorder)
    (load_name, (load_total, loads)), = [(n, p) for n, p in recorder.phases.items() if
                                         n.startswith("load ")]  # fmt: skip
    assert load_name == f"load {len(keys)} tensors (MiB)" and len(loads) == len(keys)
    (write_name, (write_total, writes)), = [(n, p) for n, p in recorder.phases.items() if
                                            n.startswith("write ")]  # fmt: skip
    assert len(result.shards) > 2 and len(writes) == len(result.shards)
    assert write_name == f"write {len(result.shards)} shard(s) (MiB)"
    size = sum(t.num_bytes for t in read_tensors(tmp_path / "hf").values())
    assert write_total == -(-size // MIB)
    for total, updates in ((load_total, loads), (write_total, writes)):
        assert updates == sorted(updates) and updates[-1] == total
