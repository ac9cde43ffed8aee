"""preprocess: Megatron reads every output and the ids equal the tokenizer's own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmctl.data import indexed
from llmctl.data.manifest import manifest_path
from llmctl.data.outputs import Interrupted
from llmctl.data.preprocess import PreprocessConfig, preprocess
from llmctl.data.readers import OnError
from llmctl.data.tokenizer import Tokenizer, resolve_tokenizer
from llmctl.errors import UserError


def _cfg(inputs: list[Path], prefix: Path, tok: Path, **kw) -> PreprocessConfig:
    return PreprocessConfig(
        inputs=[str(p) for p in inputs], output_prefix=str(prefix), tokenizer=str(tok), **kw
    )


def _expected(tok_path: Path, texts: list[str]) -> list[list[int]]:
    tok = Tokenizer(resolve_tokenizer(tok_path))
    return [[*ids, tok.eod] for ids in tok.encode_batch(texts)]


def test_megatron_reads_tokens_equal_to_direct_encoding(
    tmp_path: Path, corpus: Path, corpus_texts: list[str], hf_tokenizer: Path
) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = tmp_path / "out"
    summary = preprocess(_cfg([corpus], prefix, hf_tokenizer, num_workers=2, chunk_bytes=100_000))
    ds = IndexedDataset(str(prefix))
    expected = _expected(hf_tokenizer, corpus_texts)
    assert len(ds) == len(expected) == summary.num_docs
    assert all(ds[i].tolist() == e for i, e in enumerate(expected))
    assert ds.index.dtype == np.uint16
    assert summary.num_tokens == sum(map(len, expected)) and summary.num_chunks > 2
    manifest = json.loads(manifest_path(prefix).read_text())
    assert manifest["counts"]["tokens"] == summary.num_tokens
    assert manifest["inputs"][0]["sha256"] and manifest["tokenizer"]["sha256"]
    assert not prefix.with_name("out.llmctl-tmp").exists()


def test_worker_count_and_chunking_do_not_change_bytes(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    preprocess(_cfg([corpus], a, hf_tokenizer, num_workers=1))
    preprocess(_cfg([corpus], b, hf_tokenizer, num_workers=2, chunk_bytes=50_000))
    for path in (indexed.bin_path, indexed.idx_path):
        assert path(a).read_bytes() == path(b).read_bytes()


def test_interrupted_run_commits_nothing_and_resumes(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    prefix = tmp_path / "r"
    cfg = _cfg([corpus], prefix, hf_tokenizer, num_workers=1, chunk_bytes=100_000)
    seen = {"docs": 0}

    def interrupt(update) -> None:
        seen["docs"] += update.docs
        if seen["docs"] > 30:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted, match=r"interrupted: \d+ of \d+ chunks done and kept") as e:
        preprocess(cfg, on_progress=interrupt)
    assert e.value.exit_code == 130
    assert not indexed.bin_path(prefix).exists() and not indexed.idx_path(prefix).exists()
    resumed = preprocess(cfg)
    assert resumed.num_chunks_resumed > 0
    fresh = preprocess(_cfg([corpus], tmp_path / "f", hf_tokenizer, num_workers=1))
    assert indexed.bin_path(prefix).read_bytes() == indexed.bin_path(tmp_path / "f").read_bytes()
    assert resumed.num_tokens == fresh.num_tokens


def test_bad_input_fails_with_location_and_commits_nothing(
    tmp_path: Path, hf_tokenizer: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "good"}\n{"text": "also good"}\n{broken\n')
    prefix = tmp_path / "o"
    with pytest.raises(UserError, match=r"bad\.jsonl:3: invalid JSON"):
        preprocess(_cfg([path], prefix, hf_tokenizer))
    assert not indexed.idx_path(prefix).exists()
    summary = preprocess(_cfg([path], prefix, hf_tokenizer, on_error=OnError.SKIP))
    assert summary.num_docs == 2 and summary.problems["counts"] == {"invalid JSON": 1}


def test_tokenizer_larger_than_model_vocab_is_refused(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    with pytest.raises(UserError, match="1024 tokens but the model's vocabulary is 512"):
        preprocess(_cfg([corpus], tmp_path / "v", hf_tokenizer, model_vocab_size=512))


def test_parquet_and_text_folder_inputs(tmp_path: Path, hf_tokenizer: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"row {i}: the quick brown fox" for i in range(30)]
    pq.write_table(pa.table({"body": texts}), tmp_path / "a.parquet", row_group_size=7)
    (tmp_path / "notes").mkdir()
    for i, t in enumerate(texts[:3]):
        (tmp_path / "notes" / f"{i}.txt").write_text(t)
    prefix = tmp_path / "pq"
    cfg = _cfg([tmp_path / "a.parquet"], prefix, hf_tokenizer, text_field="body", num_workers=2)
    preprocess(cfg)
    docs = indexed.read_documents(prefix)
    assert [d.tolist() for d in docs] == _expected(hf_tokenizer, texts)
    preprocess(_cfg([tmp_path / "notes"], tmp_path / "txt", hf_tokenizer))
    docs = indexed.read_documents(tmp_path / "txt")
    assert [d.tolist() for d in docs] == _expected(hf_tokenizer, texts[:3])


def test_manifest_records_dedup_parameters_found_beside_the_input(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    from llmctl.data.dedup import DedupConfig, dedup

    dedup(DedupConfig(inputs=[str(corpus)], output_dir=str(tmp_path / "dd"), num_workers=1))
    prefix = tmp_path / "p"
    preprocess(_cfg([tmp_path / "dd" / corpus.name], prefix, hf_tokenizer))
    recorded = json.loads(manifest_path(prefix).read_text())["dedup"]
    assert recorded["threshold"] == 0.8 and recorded["report"].endswith("dedup_report.json")


def test_progress_counts_input_bytes_for_compressed_and_parquet(
    tmp_path: Path, corpus_texts: list[str], hf_tokenizer: Path
) -> None:
    """The percentage is of the input size: a .gz/.zst file (whose documents are larger than
    the file) or a Parquet row group never pushes the done bytes past the total, and a finished
    run is at exactly 100 % (it was 300+ % for compressed JSONL and short of 100 % for Parquet)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    body = "".join(json.dumps({"text": t}) + "\n" for t in corpus_texts * 3).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(body))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    pq.write_table(pa.table({"text": corpus_texts}), tmp_path / "c.parquet", row_group_size=7)
    for name in ("a.jsonl.gz", "b.jsonl.zst", "c.parquet"):
        updates = []
        preprocess(
            _cfg([tmp_path / name], tmp_path / f"o_{name}", hf_tokenizer, num_workers=1),
            on_progress=updates.append,
        )
        total = updates[0].total_bytes
        size = (tmp_path / name).stat().st_size  # Parquet: split evenly over row groups
        assert total == size if "jsonl" in name else size - 7 < total <= size
        done = np.cumsum([u.num_bytes for u in updates[1:]])
        assert done.max() <= total and done[-1] == total, (name, done.max(), total)


def test_bad_document_leaves_no_work_folder(tmp_path: Path, hf_tokenizer: Path) -> None:
    """A bad document (after good ones) or an empty input is one UserError and leaves nothing
    beside the prefix: the input must change before a rerun, so no shard would be reused
    (dedup behaves the same since 10d215b)."""
    src = tmp_path / "in"
    src.mkdir()
    good = "".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(50))
    (src / "ns.jsonl").write_text(good + '{"text": 5}\n')
    (src / "empty.jsonl").write_text("")
    for name, line in [("ns.jsonl", "ns.jsonl:51: text field is not a string"),
                       ("empty.jsonl", "no documents")]:  # fmt: skip
        with pytest.raises(UserError, match=line):
            preprocess(_cfg([src / name], tmp_path / "out", hf_tokenizer, num_workers=1))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in"], name


def test_a_json_array_line_is_named_as_such(tmp_path: Path, hf_tokenizer: Path) -> None:
    """A whole JSON array on one line (a .json file that is not JSONL) is reported as an
    array, not as a record that merely lacks the text field."""
    (tmp_path / "arr.json").write_text('[{"text": "a"}, {"text": "b"}]\n')
    with pytest.raises(
        UserError,
        match=r"arr\.json:1: missing text field \('text': the line is an array, not an object\)",
    ):
        preprocess(_cfg([tmp_path / "arr.json"], tmp_path / "o", hf_tokenizer, num_workers=1))
