"""`llmctl data sft`: chat templates, response masks, packing, bad input (issue 13, item 5).

Oracles outside llmctl: transformers renders and tokenizes the chat template itself
(`apply_chat_template(tokenize=True)`) and computes assistant masks from a template with
`{% generation %}` markers (`return_assistant_tokens_mask`); megatron-core's `IndexedDataset`
reads the packs back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from cli_refusal import assert_line_refused
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.data.sft import PackedSft, SftConfig, build_sft, output_prefixes, parse_example
from llmctl.data.sft_demo import CHATML_TEMPLATE, chat_tokenizer, translate_examples, write_jsonl
from llmctl.errors import UserError

pytest.importorskip("transformers")

# The same ChatML template with transformers' generation markers around each assistant turn.
GENERATION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n"
    "{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A Llama-3-style template (BOS first, role headers, trimmed content, <|eot_id|>), plain and
# with generation markers.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_GENERATION = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim }}<|eot_id|>"
    "{% endgeneration %}{% else %}{{ m['content'] | trim }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHAT = [
    {"role": "system", "content": "answer with the partner words"},
    {"role": "user", "content": "translate: red fox"},
    {"role": "assistant", "content": "blue owl"},
    {"role": "user", "content": "translate: one"},
    {"role": "assistant", "content": "two"},
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_tokenizer(tmp_path_factory.mktemp("chat-tok"))


@pytest.fixture(scope="module")
def hf_tok(tok_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)


def _renderer(tok_dir: Path):
    from llmctl.data.sft import ChatRenderer

    return ChatRenderer(str(tok_dir))


def test_tokens_are_the_templates_and_mask_matches_transformers(tok_dir, hf_tok):
    ids, mask = _renderer(tok_dir).encode(CHAT, "x:1")
    expected = hf_tok.apply_chat_template(CHAT, tokenize=True, return_dict=True)
    assert ids.tolist() == list(expected["input_ids"])
    oracle = hf_tok.apply_chat_template(
        CHAT,
        chat_template=GENERATION_TEMPLATE,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert list(oracle["input_ids"]) == ids.tolist()  # same text under both templates
    assert mask.tolist() == list(oracle["assistant_masks"])
    trained = hf_tok.decode([int(t) for t, m in zip(ids, mask, strict=True) if m])
    assert trained == "blue owl<|im_end|>\ntwo<|im_end|>\n"


def test_llama3_style_template_mask_matches_transformers(tok_dir, hf_tok, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "llama3"
    shutil.copytree(tok_dir, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = LLAMA3_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    chat = [*CHAT[:2], {"role": "assistant", "content": " blue owl \n"}, *CHAT[3:]]
    ids, mask = _renderer(folder).encode(chat, "x:1")
    oracle = tok.apply_chat_template(
        chat,
        chat_template=LLAMA3_GENERATION,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert ids.tolist() == list(oracle["input_ids"])
    assert mask.tolist() == list(oracle["assistant_masks"])
    trained = tok.decode([int(t) for t, m in zip(ids, mask, strict=True) if m])
    assert trained == "blue owl<|eot_id|>two<|eot_id|>"
    assert tok.decode(ids[:1].tolist()) == "<|endoftext|>" and mask[0] == 0  # BOS


def test_prompt_completion_is_one_user_and_one_assistant_turn(tok_dir, hf_tok):
    fmt, messages = parse_example('{"prompt": "translate: cat", "completion": "dog"}', "x:1")
    assert fmt == "prompt_completion"
    ids, mask = _renderer(tok_dir).encode(messages, "x:1")
    text = hf_tok.decode(ids.tolist())
    assert (
        text == "<|im_start|>user\ntranslate: cat<|im_end|>\n<|im_start|>assistant\ndog<|im_end|>\n"
    )
    assert hf_tok.decode([int(t) for t, m in zip(ids, mask, strict=True) if m]) == "dog<|im_end|>\n"


def test_packs_read_back_with_megatron(tok_dir, hf_tok, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    records = translate_examples(200, max_words=3)
    src = write_jsonl(tmp_path / "task.jsonl", records)
    summary = build_sft(
        SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "sft"), tokenizer=str(tok_dir),
                  seq_length=48)
    )  # fmt: skip
    tokens, masks, docs = (IndexedDataset(p) for p in output_prefixes(tmp_path / "sft"))
    assert len(tokens) == len(masks) == len(docs) == summary.num_packs
    assert summary.num_examples == 200 and summary.max_examples_per_pack > 1
    found = []
    for i in range(len(tokens)):
        t, m, d = tokens[i], masks[i], docs[i]
        assert len(t) == len(m) == len(d) == 49
        for doc in range(1, int(d.max()) + 1):
            found.append((tuple(t[d == doc].tolist()), tuple(m[d == doc].tolist())))
        assert not m[d == 0].any()
    expected = []
    for r in records:
        msgs = r.get("messages") or [
            {"role": "user", "content": r["prompt"]},
            {"role": "assistant", "content": r["completion"]},
        ]
        ids = hf_tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
        expected.append(tuple(ids))
    assert sorted(f[0] for f in found) == sorted(expected)  # every example exactly once
    assert sum(sum(f[1][1:]) for f in found) == summary.num_trained_tokens
    manifest = json.loads((tmp_path / "sft.manifest.json").read_text())
    assert manifest["kind"] == "sft-packed" and manifest["seq_length"] == 48
    assert manifest["tokenizer"]["vocab_size"] == len(hf_tok)
    assert summary.fill_fraction > 0.8


def test_long_examples_are_cut_and_counted(tok_dir, tmp_path):
    long = {"prompt": "translate: " + " ".join(["red"] * 40), "completion": "blue"}
    short = {"prompt": "translate: red", "completion": "blue"}
    src = write_jsonl(tmp_path / "t.jsonl", [long, short])
    summary = build_sft(
        SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "o"), tokenizer=str(tok_dir),
                  seq_length=16, pack=False)
    )  # fmt: skip
    assert summary.num_truncated == 1 and summary.num_dropped == 1  # its answer was cut off
    assert summary.num_packs == 1 and len(PackedSft(str(tmp_path / "o"))) == 1


BAD = {
    "missing_role": (
        [{"content": "hi"}, {"role": "assistant", "content": "x"}],
        "messages[0] has no 'role'",
    ),
    "unknown_role": (
        [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "x"}],
        "role 'bot' is not one of",
    ),
    "empty_assistant": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}],
        "(assistant) has empty content",
    ),
    "no_assistant": ([{"role": "user", "content": "hi"}], "no assistant message"),
    "empty_completion": ({"prompt": "hi", "completion": ""}, "'completion' is missing or empty"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_line_is_one_line_rc2_and_writes_nothing(case, tok_dir, tmp_path):
    good = {"prompt": "translate: red", "completion": "blue"}
    bad, expected = BAD[case]
    bad_record = bad if isinstance(bad, dict) else {"messages": bad}
    src = write_jsonl(tmp_path / "in.jsonl", [good, good, bad_record, good])
    out = tmp_path / "out" / "sft"
    args = ["data", "sft", str(src), "-o", str(out), "-t", str(tok_dir), "--seq-length", "32"]
    assert_line_refused(args, src, 3, expected, tmp_path / "out")


def test_console_script_prints_one_line(tok_dir, tmp_path):
    """The installed `llmctl` entry point: exactly one stderr line, rc 2, nothing written."""
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": [{"content": "hi"}]}])
    out = tmp_path / "o"
    proc = subprocess.run(
        [sys.executable, "-m", "llmctl", "data", "sft", str(src), "-o", str(out), "-t",
         str(tok_dir), "--seq-length", "32"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {src}:1: messages[0] has no 'role' (expected one of system, user, assistant, tool)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_invalid_json_names_the_line(tmp_path):
    with pytest.raises(UserError, match=r"f.jsonl:7: not valid JSON"):
        parse_example("{not json", "f.jsonl:7")


def test_failed_rerun_keeps_the_previous_output(tok_dir, tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(20))
    out = str(tmp_path / "sft")
    build_sft(
        SftConfig(inputs=[str(src)], output_prefix=out, tokenizer=str(tok_dir), seq_length=32)
    )
    before = {p.name: p.read_bytes() for p in tmp_path.glob("sft*")}
    with pytest.raises(UserError, match="pass --force"):
        build_sft(
            SftConfig(inputs=[str(src)], output_prefix=out, tokenizer=str(tok_dir), seq_length=32)
        )
    bad = write_jsonl(tmp_path / "b.jsonl", [*translate_examples(5), {"prompt": "x"}])
    with pytest.raises(UserError, match=r"b\.jsonl:6"):
        build_sft(
            SftConfig(inputs=[str(bad)], output_prefix=out, tokenizer=str(tok_dir), seq_length=32,
                      force=True)
        )  # fmt: skip
    assert {p.name: p.read_bytes() for p in tmp_path.glob("sft*")} == before


def test_files_llmctl_did_not_write_are_never_replaced(tok_dir, tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(5))
    (tmp_path / "x.bin").write_bytes(b"user data")
    with pytest.raises(UserError, match="not written by llmctl"):
        build_sft(
            SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "x"), tokenizer=str(tok_dir),
                      seq_length=32, force=True)
        )  # fmt: skip
    assert (tmp_path / "x.bin").read_bytes() == b"user data"


def test_tokenizer_without_chat_template_is_refused(tmp_path):
    from llmctl.data.tokenizer import train_bpe

    train_bpe(["red green blue"] * 50, tmp_path / "tok", vocab_size=300)
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(3))
    result = CliRunner().invoke(
        app,
        ["data", "sft", str(src), "-o", str(tmp_path / "o"), "-t", str(tmp_path / "tok"),
         "--seq-length", "32"],
    )  # fmt: skip
    assert result.exit_code == 2 and "no chat_template" in result.output


def test_template_in_the_demo_tokenizer_is_chatml(tok_dir):
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHATML_TEMPLATE


def test_compose_takes_seq_length_from_the_packs(tok_dir, tmp_path):
    from llmctl.config import compose

    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(30))
    out = str(tmp_path / "sft")
    build_sft(
        SftConfig(inputs=[str(src)], output_prefix=out, tokenizer=str(tok_dir), seq_length=40)
    )
    cfg = compose("tiny_cpu_sft", [f"data.prefixes=[{out}]"])
    assert cfg.model.seq_length == 40
    with pytest.raises(UserError, match="packed for 40"):
        compose("tiny_cpu_sft", [f"data.prefixes=[{out}]", "model.seq_length=64"])
    assert np.asarray(PackedSft(out)[0][0]).shape == (41,)


def test_dry_run_writes_nothing_and_no_pack_keeps_examples_apart(tok_dir, tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(30))
    out = str(tmp_path / "o")
    common = {"inputs": [str(src)], "output_prefix": out, "tokenizer": str(tok_dir)}
    dry = build_sft(SftConfig(**common, seq_length=48, pack=False, dry_run=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]
    real = build_sft(SftConfig(**common, seq_length=48, pack=False))
    assert dry.as_dict() | {"dry_run": False} == real.as_dict()
    assert real.num_packs == 30 and real.max_examples_per_pack == 1
    packed = build_sft(SftConfig(**common, seq_length=48, force=True))
    assert packed.num_packs < 30 and packed.num_trained_tokens == real.num_trained_tokens


def test_template_that_refuses_a_conversation_names_the_line(tok_dir, tmp_path):
    """A template's own `raise_exception` (as Mistral's and Gemma's templates do for role
    orders they do not support) becomes one line naming the input line."""
    import shutil

    strict = tmp_path / "tok"
    shutil.copytree(tok_dir, strict)
    config = json.loads((strict / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}"
        "{% endif %}" + CHATML_TEMPLATE
    )
    (strict / "tokenizer_config.json").write_text(json.dumps(config))
    records = [
        {"prompt": "translate: red", "completion": "blue"},
        *translate_examples(1, chat_share=1),
    ]
    src = write_jsonl(tmp_path / "a.jsonl", records)
    with pytest.raises(UserError, match=r"a\.jsonl:2: the chat template refused .*no system role"):
        build_sft(
            SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "o"), tokenizer=str(strict),
                      seq_length=32)
        )  # fmt: skip
    assert not list(tmp_path.glob("o*"))


def test_progress_lines_in_logs_and_gz_input(tok_dir, tmp_path, capsys):
    import gzip

    from llmctl.data.sft import run_sft

    lines = "".join(json.dumps(r) + "\n" for r in translate_examples(600))
    src = tmp_path / "a.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write(lines)
    cfg = SftConfig(inputs=[str(tmp_path)], output_prefix=str(tmp_path / "o"),
                    tokenizer=str(tok_dir), seq_length=48, dry_run=True)  # fmt: skip
    summary = run_sft(cfg, interval_s=0.0)
    err = capsys.readouterr().err.splitlines()
    assert summary["num_examples"] == 600
    assert [x.split(" examples")[0] for x in err] == ["sft: 256", "sft: 512"]
    run_sft(cfg, show_progress=False, interval_s=0.0)
    assert capsys.readouterr().err == ""


def test_non_utf8_line_is_named(tok_dir, tmp_path):
    src = tmp_path / "a.jsonl"
    good = json.dumps({"prompt": "translate: red", "completion": "blue"}).encode()
    src.write_bytes(good + b"\n" + b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(UserError, match=r"a\.jsonl:2: not UTF-8 text"):
        build_sft(
            SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "o"), tokenizer=str(tok_dir),
                      seq_length=32)
        )  # fmt: skip


def test_sft_recipe_refuses_pretraining_data(tok_dir, tmp_path, run_main):
    """recipe=tiny_cpu_sft says data.sft=true: a pretraining prefix (or none, the demo
    corpus) is one line before any rank starts, not a run that trains on every token;
    data.sft=null takes it, and data.sft=false refuses SFT packs."""
    from llmctl.data.preprocess import PreprocessConfig, preprocess
    from llmctl.launch.api import prepare_train

    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(30))
    packs = str(tmp_path / "sft")
    build_sft(
        SftConfig(inputs=[str(src)], output_prefix=packs, tokenizer=str(tok_dir), seq_length=40)
    )
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": f"word {i} " * 40}) + "\n" for i in range(40)))
    pre = str(tmp_path / "pre")
    preprocess(PreprocessConfig(inputs=[str(plain)], output_prefix=pre, tokenizer=str(tok_dir)))
    common = [
        "model.vocab_size=512",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"train.run_dir={tmp_path / 'run'}",
    ]
    argv = ["train", "recipe=tiny_cpu_sft", f"data.prefixes=[{pre}]", *common, "--dry-run"]
    code, stdout, stderr = run_main(argv)
    assert (code, stdout) == (2, ""), stderr
    assert stderr.count("\n") == 1 and f"data prefix {pre} is not an SFT pack" in stderr, stderr
    with pytest.raises(UserError, match=r"data\.sft=true needs data\.prefixes"):
        prepare_train("tiny_cpu_sft", common)
    assert not (tmp_path / "cache").exists()  # the demo corpus was not built either
    with pytest.raises(UserError, match=re.escape(f"data prefix {packs} is an SFT pack")):
        prepare_train("tiny_cpu_sft", [f"data.prefixes=[{packs}]", "data.sft=false", *common])
    assert prepare_train("tiny_cpu_sft", [f"data.prefixes=[{pre}]", "data.sft=null", *common])
    assert prepare_train("tiny_cpu_sft", [f"data.prefixes=[{packs}]", *common])


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for m in messages %}{{ m.content }", "does not compile"),
        ("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", "does not compile"),
        (5, "not a Jinja template string"),
    ],
)
def test_broken_chat_template_blames_the_tokenizer_not_a_line(
    template, expected, tok_dir, tmp_path
):
    """A template that transformers itself cannot compile is a fault of `--tokenizer`, found
    before any input is read: the message names the tokenizer folder, not line 1 of the data."""
    import shutil

    import jinja2
    from transformers import AutoTokenizer

    broken = tmp_path / "tok"
    shutil.copytree(tok_dir, broken)
    config = json.loads((broken / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    hf = AutoTokenizer.from_pretrained(str(broken), local_files_only=True)
    # the oracle: transformers cannot render with it either
    with pytest.raises((jinja2.TemplateError, TypeError)):
        hf.apply_chat_template(CHAT, tokenize=False)
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(2))
    with pytest.raises(UserError, match=rf"^--tokenizer {broken}: .*{expected}") as err:
        build_sft(
            SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "o"), tokenizer=str(broken),
                      seq_length=32)
        )  # fmt: skip
    assert "a.jsonl" not in str(err.value)
    assert not list(tmp_path.glob("o*"))


def test_every_example_dropped_says_why_not_no_examples(tok_dir, tmp_path):
    """Examples were read but none kept a trained token (all responses cut by --seq-length):
    the line counts them and names the remedy instead of claiming the input has none."""
    src = write_jsonl(tmp_path / "a.jsonl", translate_examples(3, chat_share=1))
    with pytest.raises(UserError, match=r"all 3 examples .* dropped.*--seq-length 4") as err:
        build_sft(
            SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "o"), tokenizer=str(tok_dir),
                      seq_length=4)
        )  # fmt: skip
    assert "no examples" not in str(err.value)
    assert not list(tmp_path.glob("o*"))


def test_zst_input_reads_like_the_plain_file(tok_dir, tmp_path):
    """`.jsonl.zst` (as `data preprocess` reads it), given directly or found in a folder, gives
    the same packs as the plain `.jsonl` (it was 'not UTF-8 text', and skipped in folders)."""
    import zstandard

    src = write_jsonl(tmp_path / "plain" / "a.jsonl", translate_examples(20))
    packed = tmp_path / "zst"
    packed.mkdir()
    zst = packed / "a.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(src.read_bytes()))
    common = {"tokenizer": str(tok_dir), "seq_length": 48, "dry_run": True}
    plain = build_sft(SftConfig(inputs=[str(src)], output_prefix=str(tmp_path / "o"), **common))
    for given in (zst, packed):
        got = build_sft(SftConfig(inputs=[str(given)], output_prefix=str(tmp_path / "o"), **common))
        assert got.num_examples == plain.num_examples == 20
        assert got.num_trained_tokens == plain.num_trained_tokens


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_archive_is_one_line_not_fewer_examples(suffix, tok_dir, tmp_path):
    """A cut-off .gz/.zst is refused naming the file (a cut .zst was read as a shorter file)."""
    import gzip

    import zstandard

    body = write_jsonl(tmp_path / "a.jsonl", translate_examples(400)).read_bytes()
    packed = gzip.compress(body) if suffix == ".gz" else zstandard.ZstdCompressor().compress(body)
    cut = tmp_path / f"cut.jsonl{suffix}"
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(UserError, match=r"cut\.jsonl\.(gz|zst):\d+: truncated archive"):
        build_sft(
            SftConfig(inputs=[str(cut)], output_prefix=str(tmp_path / "o"), tokenizer=str(tok_dir),
                      seq_length=48, dry_run=True)
        )  # fmt: skip
