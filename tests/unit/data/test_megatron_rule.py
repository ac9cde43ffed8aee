"""Byte identity with Megatron-LM's tools/preprocess_data.py on awkward documents, without its
checkout: the expected `.bin/.idx` are built by megatron-core's own tokenizer and
`IndexedDatasetBuilder`, following the script's documented rule (core_v0.16.1, `Encoder.encode`
and `Partition.process_json_file`): every JSONL record is one document; its text goes through
`MegatronTokenizer.tokenize` whole; a document with tokens gets one sequence of
`tokens + [eod]` (`--append-eod`); a document without tokens (empty text) is
`add_document([], [])`: a document-index entry and no sequence. Whitespace-only documents are
kept. tests/integration/test_data_megatron_lm.py runs the script itself on the same corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmctl.data import indexed
from llmctl.data.preprocess import PreprocessConfig, preprocess
from llmctl.errors import UserError

# Empty, whitespace-only, non-ASCII, control characters (JSON escapes), a literal special
# token, CRLF text, and a document larger than one tokenizer batch (1 MiB).
AWKWARD = [
    "plain text first",
    "",
    " ",
    "\n\n\t  \n",
    "café 日本語 😀 Ελληνικά",
    "ctl \u0000 \u0007 \u001b[0m \u007f \u2028 end",
    "a <|endoftext|> b",
    "",
    "line one\r\nline two\r\n",
    "big " * 280_000,  # 1.1 MB: more than one tokenizer batch (1 MiB)
    "",
]


def write_awkward(path: Path) -> Path:
    """The corpus as JSONL (ensure_ascii=False, so the file holds raw UTF-8)."""
    lines = [json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in AWKWARD]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def megatron_expected(tok_dir: Path, texts: list[str], out_prefix: Path) -> None:
    """What preprocess_data.py --append-eod writes, built from megatron-core's parts."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from megatron.core.tokenizers import MegatronTokenizer

    tok = MegatronTokenizer.from_pretrained(
        tokenizer_path=str(tok_dir), metadata_path={"library": "huggingface"}
    )
    builder = IndexedDatasetBuilder(f"{out_prefix}.bin", dtype=DType.optimal_dtype(tok.vocab_size))
    for text in texts:
        ids = list(tok.tokenize(text))
        lens = [len(ids)] if ids else []
        if ids:
            ids.append(tok.eod)
            lens[-1] += 1
        builder.add_document(ids, lens)
    builder.finalize(f"{out_prefix}.idx")


@pytest.mark.parametrize("workers", [1, 2])
def test_awkward_documents_byte_identical_to_megatron_rule(
    tmp_path: Path, hf_tokenizer: Path, workers: int
) -> None:
    corpus = write_awkward(tmp_path / "awkward.jsonl")
    megatron_expected(hf_tokenizer.parent, AWKWARD, tmp_path / "expected")
    prefix = tmp_path / "ours"
    cfg = PreprocessConfig(
        inputs=[str(corpus)], output_prefix=str(prefix), tokenizer=str(hf_tokenizer),
        num_workers=workers, chunk_bytes=200_000,
    )  # fmt: skip
    summary = preprocess(cfg)
    for suffix in (".bin", ".idx"):
        ours = Path(f"{prefix}{suffix}").read_bytes()
        assert ours == Path(f"{tmp_path / 'expected'}{suffix}").read_bytes(), suffix
    # Counts from the rule itself: every record is a document; the empty ones have no
    # sequence (a byte-level BPE gives every non-empty text at least one token).
    num_empty = sum(1 for t in AWKWARD if t == "")
    assert summary.num_docs == len(AWKWARD) and summary.num_empty_docs == num_empty
    head = indexed.read_header(prefix)
    assert head.num_sequences == len(AWKWARD) - num_empty
    assert head.num_doc_indices == len(AWKWARD) + 1
    expected_index = np.concatenate([[0], np.cumsum([t != "" for t in AWKWARD])])
    assert indexed.read_doc_indices(prefix).tolist() == expected_index.tolist()


def test_drop_empty_is_the_named_opt_in(tmp_path: Path, hf_tokenizer: Path) -> None:
    corpus = write_awkward(tmp_path / "awkward.jsonl")
    prefix = tmp_path / "dropped"
    cfg = PreprocessConfig(
        inputs=[str(corpus)], output_prefix=str(prefix), tokenizer=str(hf_tokenizer),
        num_workers=1, drop_empty=True,
    )  # fmt: skip
    summary = preprocess(cfg)
    kept = [t for t in AWKWARD if t.strip()]
    assert summary.num_docs == len(kept) and summary.num_empty_docs == 0
    assert summary.problems["counts"] == {"empty document": len(AWKWARD) - len(kept)}
    assert indexed.read_header(prefix).num_sequences == len(kept)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("\n", "blank line"),
        ('{"text": "\\ud800 lone"}\n', "invalid UTF-8 (lone surrogate"),
        ('{"text": "raw \x01 control"}\n', "invalid JSON (Invalid control character"),
        ('{"text": ["pre", "split"]}\n', "text field is not a string"),
    ],
)
def test_records_megatron_lm_cannot_read_fail_with_their_line(
    tmp_path: Path, hf_tokenizer: Path, line: str, problem: str
) -> None:
    """Megatron-LM stops with a traceback on these; llmctl stops with one line naming it."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line, encoding="utf-8")
    cfg = PreprocessConfig(
        inputs=[str(path)], output_prefix=str(tmp_path / "o"), tokenizer=str(hf_tokenizer),
        num_workers=1,
    )  # fmt: skip
    with pytest.raises(UserError, match=r"bad\.jsonl:2: " + problem.replace("(", r"\(")):
        preprocess(cfg)
    assert not (tmp_path / "o.idx").exists()


def test_bos_post_processor_is_not_applied_as_in_megatron(
    tmp_path: Path, hf_tokenizer: Path
) -> None:
    """A tokenizer.json whose post-processor adds a BOS (Llama 2/3, Mistral): Megatron-LM's
    `HuggingFaceTokenizer` (default, no `--tokenizer-hf-include-special-tokens`) tokenizes
    without it, so an empty document stays without a sequence; llmctl writes the same bytes
    with either engine (it added BOS to every document and wrote [BOS, EOD] for an empty one)."""
    import shutil

    from megatron.core.tokenizers import MegatronTokenizer
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    from llmctl.data.tokenizer import Tokenizer, resolve_tokenizer

    tok_dir = tmp_path / "bos_tok"
    shutil.copytree(hf_tokenizer.parent, tok_dir)
    tok = HFTokenizer.from_file(str(tok_dir / "tokenizer.json"))
    tok.add_special_tokens(["<s>"])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    tok.save(str(tok_dir / "tokenizer.json"))
    assert tok.encode("x").ids[0] == bos  # the file really adds a BOS
    oracle = MegatronTokenizer.from_pretrained(
        tokenizer_path=str(tok_dir), metadata_path={"library": "huggingface"}
    )
    expected = [list(oracle.tokenize(t)) for t in AWKWARD]
    for engine in ("reference", "fastokens"):
        ours = Tokenizer(resolve_tokenizer(tok_dir), engine=engine)
        assert ours.engine.value == engine
        assert ours.encode_batch(AWKWARD) == expected, engine
    megatron_expected(tok_dir, AWKWARD, tmp_path / "expected")
    prefix = tmp_path / "ours"
    cfg = PreprocessConfig(
        inputs=[str(write_awkward(tmp_path / "awkward.jsonl"))], output_prefix=str(prefix),
        tokenizer=str(tok_dir), num_workers=1, chunk_bytes=200_000,
    )  # fmt: skip
    preprocess(cfg)
    for suffix in (".bin", ".idx"):
        ours_bytes = Path(f"{prefix}{suffix}").read_bytes()
        assert ours_bytes == Path(f"{tmp_path / 'expected'}{suffix}").read_bytes(), suffix
