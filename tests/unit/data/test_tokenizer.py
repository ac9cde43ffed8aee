"""Each tokenizer kind loads from a local file and encodes as its own library does."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from llmctl.data.tokenizer import (
    EOD_TOKEN,
    Tokenizer,
    TokenizerKind,
    resolve_tokenizer,
    train_tokenizer,
)
from llmctl.errors import UserError


def test_trained_bpe_is_loadable_by_tokenizers_and_transformers(
    hf_tokenizer: Path, corpus_texts: list[str]
) -> None:
    from tokenizers import Tokenizer as HF
    from transformers import AutoTokenizer

    tok = Tokenizer(resolve_tokenizer(hf_tokenizer.parent))
    ref = HF.from_file(str(hf_tokenizer))
    auto = AutoTokenizer.from_pretrained(str(hf_tokenizer.parent))
    assert tok.vocab_size == 1024
    assert tok.eod == ref.token_to_id(EOD_TOKEN) == auto.eos_token_id
    texts = corpus_texts[:5]
    assert tok.encode_batch(texts) == [ref.encode(t).ids for t in texts]
    assert [auto(t).input_ids for t in texts] == [ref.encode(t).ids for t in texts]


def test_sentencepiece(tmp_path: Path, corpus_texts: list[str]) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(t for doc in corpus_texts for t in doc.splitlines() if t.strip()),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=300,
        model_type="bpe",
        minloglevel=2,
    )
    tok = Tokenizer(resolve_tokenizer(tmp_path / "sp.model"))
    ref = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    assert tok.spec.kind is TokenizerKind.SENTENCEPIECE
    assert tok.eod == ref.eos_id() and tok.vocab_size == 300
    assert tok.encode_batch(corpus_texts[:3]) == [ref.encode(t) for t in corpus_texts[:3]]


def test_tiktoken(tmp_path: Path) -> None:
    import tiktoken

    from llmctl.data.tokenizer import TIKTOKEN_PATTERN

    merges = [b"th", b"he", b"in", b"the"]
    ranks = {bytes([i]): i for i in range(256)} | {m: 256 + i for i, m in enumerate(merges)}
    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(k).decode()} {v}\n" for k, v in ranks.items()))
    tok = Tokenizer(resolve_tokenizer(path))
    ref = tiktoken.Encoding(
        "ref", pat_str=TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    texts = ["the thin hen", "in the end\nthere"]
    assert tok.encode_batch(texts) == [ref.encode_ordinary(t) for t in texts]
    assert tok.eod == len(ranks) and tok.vocab_size == len(ranks) + 1


def test_unknown_tokenizer_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        resolve_tokenizer(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(UserError, match="cannot load"):
        Tokenizer(resolve_tokenizer(tmp_path / "junk.json"))


def test_train_tokenizer_from_files(tmp_path: Path, corpus: Path) -> None:
    summary = train_tokenizer([str(corpus)], tmp_path / "t", vocab_size=600)
    assert summary["vocab_size"] == 600 and summary["num_docs"] == 60
    config = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == EOD_TOKEN
