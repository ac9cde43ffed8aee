"""`llmctl data prefs` and the feedback format (issue 20, items 2 and 4).

Oracles outside the code under test: transformers renders each sequence of a pair with the
chat template itself (`apply_chat_template`); the feedback lines' SFT targets are compared
with `data sft` of the same conversations written as plain chat lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_refusal import assert_line_refused
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.data.prefs import PrefsConfig, build_prefs
from llmctl.data.sft import PackedSft, SftConfig, build_sft, output_prefixes
from llmctl.data.sft_demo import chat_tokenizer, write_jsonl

pytest.importorskip("transformers")

GOOD = {"prompt": "translate: red", "chosen": "blue", "rejected": "cat dog"}
CHAT = {
    "messages": [
        {"role": "system", "content": "answer with the partner words"},
        {"role": "user", "content": "translate: one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "translate: fox"},
    ],
    "chosen": [{"role": "assistant", "content": "owl"}],
    "rejected": "lime",
}
FEEDBACK = {
    "prompt": "translate: cat",
    "bad_response": "fig",
    "corrected_response": "dog",
    "source": "prod:2026-12-01#17",
    "model": "runs/sft-v1",
}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_tokenizer(tmp_path_factory.mktemp("chat-tok"))


def _build(tok_dir: Path, tmp_path: Path, rows: list[dict], **kw) -> tuple[str, Path]:
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    prefix = str(tmp_path / "out" / "pairs")
    build_prefs(
        PrefsConfig(inputs=[str(src)], output_prefix=prefix, tokenizer=str(tok_dir),
                    seq_length=kw.pop("seq_length", 64), **kw)
    )  # fmt: skip
    return prefix, src


def _sequences(prefix: str) -> list[tuple[list[int], list[int]]]:
    """(ids, mask) of every example of every pack, in order."""
    out = []
    for tokens, mask, docs in (PackedSft(prefix)[i] for i in range(len(PackedSft(prefix)))):
        for d in range(1, int(docs.max()) + 1):
            sel = docs == d
            out.append((tokens[sel].tolist(), mask[sel].tolist()))
    return out


def test_pairs_are_the_templates_tokens_with_reply_only_masks(tok_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    rows = [GOOD, CHAT, FEEDBACK]
    prefix, _ = _build(tok_dir, tmp_path, rows, pack=False, seq_length=128)
    seqs = _sequences(prefix)
    assert len(seqs) == 6 and len(PackedSft(prefix)) == 3  # one pair per pack
    prompts = [
        [{"role": "user", "content": GOOD["prompt"]}],
        CHAT["messages"],
        [{"role": "user", "content": FEEDBACK["prompt"]}],
    ]
    replies = [("blue", "cat dog"), ("owl", "lime"), ("dog", "fig")]  # feedback: corrected first
    for k, (prompt, pair) in enumerate(zip(prompts, replies, strict=True)):
        head = tok.apply_chat_template(
            prompt, tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        for which, reply in enumerate(pair):
            conv = [*prompt, {"role": "assistant", "content": reply}]
            full = list(tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"])
            ids, mask = seqs[2 * k + which]
            assert ids == full
            assert mask == [0] * len(head) + [1] * (len(full) - len(head))  # prompt: 0
            assert tok.decode(ids[len(head) :]) == f"{reply}<|im_end|>\n"


def test_pairs_stay_together_in_packs_and_manifest_names_the_sources(tok_dir, tmp_path):
    rows = [GOOD, CHAT, FEEDBACK] * 5
    prefix, src = _build(tok_dir, tmp_path, rows, seq_length=128)
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    counts = manifest["counts"]
    assert manifest["kind"] == "prefs-packed" and counts["num_pairs"] == 15
    assert counts["max_pairs_per_pack"] >= 2 and counts["num_packs"] < 15
    assert counts["formats"] == {"prompt": 5, "chat": 5, "feedback": 5}
    (entry,) = manifest["inputs"]
    assert entry["path"] == str(src) and len(entry["sha256"]) == 64
    assert entry["sources"] == {"prod:2026-12-01#17": 5} and entry["models"] == {"runs/sft-v1": 5}
    for _, _, docs in (PackedSft(prefix)[i] for i in range(len(PackedSft(prefix)))):
        assert int(docs.max()) % 2 == 0  # whole pairs only
    firsts = {tuple(ids[-6:]) for ids, _ in _sequences(prefix)[0::2]}
    seconds = {tuple(ids[-6:]) for ids, _ in _sequences(prefix)[1::2]}
    assert not firsts & seconds  # odd examples are the chosen replies, even the rejected


def test_feedback_lines_are_sft_targets_and_preference_pairs(tok_dir, tmp_path):
    """`data sft` trains the corrected reply of a feedback line, exactly as a chat line with
    that reply; `data prefs` pairs corrected (chosen) against bad (rejected)."""
    user = {"role": "user", "content": FEEDBACK["prompt"]}
    chat = {"messages": [user, {"role": "assistant", "content": FEEDBACK["corrected_response"]}]}
    outs = {}
    for name, row in (("feedback", FEEDBACK), ("chat", chat)):
        src = write_jsonl(tmp_path / f"{name}.jsonl", [row])
        prefix = str(tmp_path / name)
        build_sft(SftConfig(inputs=[str(src)], output_prefix=prefix, tokenizer=str(tok_dir),
                            seq_length=32))  # fmt: skip
        outs[name] = [np.asarray(a).tolist() for a in PackedSft(prefix)[0]]
        manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
        assert manifest["counts"]["formats"][name] == 1
    assert outs["feedback"] == outs["chat"]
    assert json.loads(Path(f"{tmp_path}/feedback.manifest.json").read_text())["inputs"][0][
        "sources"
    ] == {"prod:2026-12-01#17": 1}
    prefix, _ = _build(tok_dir, tmp_path, [FEEDBACK])
    (chosen, _), _ = _sequences(prefix)
    assert chosen == outs["chat"][0][: len(chosen)]  # chosen = prompt + corrected reply


BAD = {
    "no_chosen": ({"prompt": "hi", "rejected": "x"}, "'chosen' is missing"),
    "no_rejected": ({"prompt": "hi", "chosen": "x"}, "'rejected' is missing"),
    "equal": ({"prompt": "hi", "chosen": "same", "rejected": "same"}, "'chosen' equals 'rejected'"),
    "no_prompt": ({"chosen": "a", "rejected": "b"}, "expected 'prompt'"),
    "feedback_uncorrected": (
        {"prompt": "hi", "bad_response": "a", "corrected_response": "a"},
        "nothing was corrected",
    ),
    "feedback_no_bad": ({"prompt": "hi", "corrected_response": "a"}, "'bad_response' is missing"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_line_is_one_line_rc2_and_writes_nothing(case, tok_dir, tmp_path):
    bad, expected = BAD[case]
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD, GOOD, bad, GOOD])
    out = tmp_path / "out" / "pairs"
    args = ["data", "prefs", str(src), "-o", str(out), "-t", str(tok_dir), "--seq-length", "64"]
    assert_line_refused(args, src, 3, expected, tmp_path / "out")


def test_sft_refuses_a_preference_line_by_name(tok_dir, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD])
    args = ["data", "sft", str(src), "-o", str(tmp_path / "o"), "-t", str(tok_dir),
            "--seq-length", "32"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2 and f"{src}:1: " in result.output
    assert "use `llmctl data prefs`" in result.output


def test_pair_longer_than_a_pack_is_dropped_and_counted(tok_dir, tmp_path):
    long = {"prompt": "translate: " + " ".join(["red"] * 30), "chosen": "blue", "rejected": "cat"}
    prefix, _ = _build(tok_dir, tmp_path, [GOOD, long], seq_length=32)
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    assert manifest["counts"]["num_dropped"] == 1 and manifest["counts"]["num_pairs"] == 2
    assert len(_sequences(prefix)) == 2
    for part in output_prefixes(prefix):
        assert Path(part + ".bin").is_file()
