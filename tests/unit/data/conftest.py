"""Fixtures for the data tests: a small real corpus and a tokenizer trained on it (once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmctl.data.corpus import build_demo_corpus
from llmctl.data.tokenizer import train_bpe


def _write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: t, "i": i}) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.fixture(scope="session")
def write_jsonl():
    """write_jsonl(path, texts, field="text"): one JSON object per line."""
    return _write_jsonl


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 standard-library source files as JSONL (about 1 MB)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    build_demo_corpus(path, max_docs=60)
    return path


@pytest.fixture(scope="session")
def corpus_texts(corpus: Path) -> list[str]:
    """The corpus texts, in order."""
    return [json.loads(line)["text"] for line in corpus.read_text().splitlines()]


@pytest.fixture(scope="session")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory, corpus_texts: list[str]) -> Path:
    """A 1024-token byte-level BPE tokenizer trained on the corpus."""
    out = tmp_path_factory.mktemp("tok")
    return train_bpe(corpus_texts, out, vocab_size=1024)
