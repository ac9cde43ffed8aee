"""Chunking partitions inputs exactly; bad input is reported with file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from llmctl.data.readers import (
    BadInputError,
    InputKind,
    OnError,
    ProblemLog,
    discover,
    input_kind,
    iter_documents,
    plan_chunks,
)
from llmctl.errors import UserError


def _read_all(paths: list[Path], chunk_bytes: int, **kw) -> list:
    chunks, _ = plan_chunks(paths, chunk_bytes)
    return [d for c in chunks for d in iter_documents(c, **kw)]


@pytest.mark.parametrize("chunk_bytes", [1, 50, 333, 4096, 1 << 30])
def test_chunks_partition_lines_exactly(tmp_path: Path, chunk_bytes: int, write_jsonl) -> None:
    texts = [f"doc {i} " + "x" * (i * 7 % 97) for i in range(300)]
    path = write_jsonl(tmp_path / "a.jsonl", texts)
    docs = _read_all([path], chunk_bytes)
    assert [d.text for d in docs] == texts
    assert [d.line for d in docs] == list(range(1, 301))


def test_compressed_and_parquet_and_text(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    texts = [f"text number {i}" for i in range(50)]
    raw = "".join(json.dumps({"body": t}) + "\n" for t in texts).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    pq.write_table(pa.table({"body": texts}), tmp_path / "c.parquet", row_group_size=16)
    (tmp_path / "txt").mkdir()
    for i, t in enumerate(texts[:3]):
        (tmp_path / "txt" / f"{i}.txt").write_text(t)
    files = discover([tmp_path])
    assert [input_kind(f) for f in files] == [InputKind.JSONL] * 2 + [InputKind.PARQUET] + [
        InputKind.TEXT
    ] * 3
    docs = _read_all(files, 1 << 20, text_field="body")
    assert [d.text for d in docs] == texts * 3 + texts[:3]


BAD_LINES = [
    (b'{"text": "fine"}\n', None),
    (b"{not json}\n", "invalid JSON"),
    (b'{"other": "x"}\n', "missing text field"),
    (b'{"text": 3}\n', "text field is not a string"),
    (b'{"text": "caf\xe9"}\n', "invalid UTF-8"),
    (b'{"text": "   "}\n', "empty document"),
    (b'{"text": "' + b"y" * 200 + b'"}\n', "document too large"),
]


def _bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(line for line, _ in BAD_LINES))
    return path


def test_skip_counts_each_problem_with_its_line(tmp_path: Path) -> None:
    log = ProblemLog()
    docs = _read_all(
        [_bad_file(tmp_path)], 1 << 20, on_error=OnError.SKIP, log=log, max_doc_bytes=100
    )
    assert [d.text for d in docs] == ["fine"]
    expected = {problem: 1 for _, problem in BAD_LINES if problem}
    assert dict(log.counts) == expected
    for line_no, (_, problem) in enumerate(BAD_LINES, start=1):
        if problem:
            assert any(f"bad.jsonl:{line_no}: {problem}" in e for e in log.examples)


@pytest.mark.parametrize("chunk_bytes", [16, 1 << 20])
def test_fail_stops_at_first_structural_problem(tmp_path: Path, chunk_bytes: int) -> None:
    with pytest.raises(BadInputError, match=r"bad\.jsonl:2: invalid JSON"):
        _read_all([_bad_file(tmp_path)], chunk_bytes, on_error=OnError.FAIL)


def test_empty_documents_skip_even_under_fail(tmp_path: Path, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "e.jsonl", ["a", "", "b"])
    log = ProblemLog()
    docs = _read_all([path], 1 << 20, on_error=OnError.FAIL, log=log)
    assert [d.text for d in docs] == ["a", "b"]
    assert log.counts["empty document"] == 1


def test_missing_input_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        discover([tmp_path / "nope.jsonl"])


def test_small_inputs_still_split_for_every_worker(tmp_path: Path, write_jsonl) -> None:
    from llmctl.data.readers import MIN_CHUNK_BYTES, chunk_size

    path = write_jsonl(tmp_path / "m.jsonl", ["w" * 1000] * 3000)  # ~3 MB
    assert chunk_size([path], 32 << 20) == MIN_CHUNK_BYTES
    chunks, _ = plan_chunks([path], 32 << 20)
    assert len(chunks) == 3
    assert len([d for c in chunks for d in iter_documents(c)]) == 3000


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_archive_is_named_with_offset_not_a_bad_line(tmp_path: Path, suffix: str) -> None:
    """A cut download: reported as truncated with the file and the byte offset where the
    compressed stream ends; the partial last line is not parsed (no "invalid JSON")."""
    import zstandard

    lines = b"".join(
        json.dumps({"text": f"document {i} " * 20}).encode() + b"\n" for i in range(4000)
    )
    whole = gzip.compress(lines) if suffix == ".gz" else zstandard.ZstdCompressor().compress(lines)
    path = tmp_path / f"cut.jsonl{suffix}"
    path.write_bytes(whole[: len(whole) // 2])
    (chunk,), _ = plan_chunks([path])
    with pytest.raises(
        BadInputError, match=r"truncated archive \((gzip|zstd) stream ends at byte"
    ) as e:
        list(iter_documents(chunk))
    assert str(e.value).startswith(f"{path}:") and f"byte {len(whole) // 2} " in str(e.value)
    log = ProblemLog()
    docs = list(iter_documents(chunk, on_error=OnError.SKIP, log=log))
    assert dict(log.counts) == {"truncated archive": 1}
    assert 0 < len(docs) < 4000
    assert [d.text for d in docs] == [f"document {i} " * 20 for i in range(len(docs))]
    assert f":{len(docs) + 1}: truncated archive" in log.examples[0]
    path.write_bytes(whole + whole)  # two complete members/frames: read through, no problem
    (chunk,), _ = plan_chunks([path])
    assert len(list(iter_documents(chunk))) == 8000
