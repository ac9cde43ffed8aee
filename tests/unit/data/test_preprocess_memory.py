"""Issue 12, bounded memory: huge documents are read as segment streams and tokenized a piece
at a time, with the ids of the tokenizer's own library (`tokenizers`, the oracle) and the same
bad-input reports as the whole-document path; a worker's peak RSS grows by about one byte per
document byte."""

from __future__ import annotations

import json
from pathlib import Path

import memory_probe
import numpy as np
import pytest

from llmctl.data import indexed, preprocess, readers, tokenizer
from llmctl.data.preprocess import PreprocessConfig
from llmctl.data.readers import BadInputError, OnError, ProblemLog, iter_documents, plan_chunks

WIDE = "caf\u00e9 \u0436\u0438\u0437\u043d\u044c \u4e2d\u6587 \U0001f600\U0001f3fd \u2028 "
ODD = 'say "hi" \\ back\\slash \\u00e9 \t tab\r\n crlf \x00\x1b[0m <|endoftext|> '


@pytest.fixture
def small_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream every document above 2 kB, in 777-byte segments, cut into ~300-character
    pieces and 500-character engine calls: many boundaries on small test documents."""
    monkeypatch.setattr(preprocess, "STREAM_BYTES", 2048)
    monkeypatch.setattr(readers, "SEGMENT_BYTES", 777)
    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 300)
    monkeypatch.setattr(tokenizer, "_CALL_CHARS", 500)


def _texts(corpus_texts: list[str]) -> list[str]:
    code = "".join(corpus_texts)[:200_000]
    mixed = "".join(code[i : i + 40] + WIDE[i % len(WIDE)] for i in range(0, 60_000, 40))
    return [
        code[:30_000],
        mixed,
        "",
        (ODD + code[:500]) * 40,
        "\u4e2d\u6587\u5b57" * 4000,  # no safe cut anywhere: one piece
        " \n\t" * 3000,  # whitespace only: kept, tokenized (Megatron-LM)
        code[30_000:31_000],  # small: the ordinary path
        code[40_000:70_000] + "\U0001f600",
    ]


def _write_inputs(tmp_path: Path, texts: list[str]) -> list[Path]:
    lines = []
    for i, t in enumerate(texts):
        if i == 3:  # a decoy "text" key before the real one: the streaming path must decline
            rec = {"meta": {"text": "decoy"}, "text": t, "id": i}
        elif i == 7:  # "text" as a value first: the key after it is found
            rec = {"kind": "text", "note": '"text": "no"', "text": t}
        else:
            rec = {"id": i, "text": t, "tail": [1, {"x": "y"}]}
        lines.append(json.dumps(rec, ensure_ascii=i % 2 == 0))
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    txt = tmp_path / "big.txt"
    txt.write_text(texts[1], encoding="utf-8")
    return [jsonl, txt]


def _reference_bin(tok_path: Path, texts: list[str]) -> bytes:
    from tokenizers import Tokenizer as HF

    ref = HF.from_file(str(tok_path))
    eod = ref.token_to_id(tokenizer.EOD_TOKEN)
    ids: list[int] = []
    for t in texts:
        doc = ref.encode(t).ids
        ids += [*doc, eod] if doc else []
    return np.asarray(ids, dtype=np.uint16).tobytes()


def test_streamed_documents_give_the_reference_ids(
    small_stream: None,
    monkeypatch: pytest.MonkeyPatch,
    hf_tokenizer: Path,
    corpus_texts: list[str],
    tmp_path: Path,
) -> None:
    """Every document, streamed or read whole, gives `tokenizers`' ids of its whole text plus
    the EOD (none for the empty one): the .bin equals the reference byte for byte."""
    texts = _texts(corpus_texts)
    inputs = _write_inputs(tmp_path, texts)
    chunks, _ = plan_chunks(inputs)
    docs = [d for c in chunks for d in iter_documents(c, keep_empty=True, stream_bytes=2048)]
    streamed = [d.stream is not None for d in docs]
    assert streamed == [True, True, False, False, True, True, False, True, True], streamed
    for prefix, stream_bytes in (("streamed", 2048), ("whole", 0)):
        monkeypatch.setattr(preprocess, "STREAM_BYTES", stream_bytes)
        cfg = PreprocessConfig(
            inputs=[str(p) for p in inputs],
            output_prefix=str(tmp_path / prefix),
            tokenizer=str(hf_tokenizer),
            num_workers=1,
        )
        summary = preprocess.preprocess(cfg)
        assert summary.num_docs == len(texts) + 1
        got = indexed.bin_path(tmp_path / prefix).read_bytes()
        assert got == _reference_bin(hf_tokenizer, [*texts, texts[1]]), prefix
        doc_index = indexed.read_doc_indices(tmp_path / prefix)
        assert len(doc_index) == len(texts) + 2  # the empty document has its entry


@pytest.mark.parametrize(
    "bad",
    [
        '{"text": "%s\\ud800 tail"}',  # lone surrogate escape after many segments
        '{"text": "%s\x01"}',  # raw control character
        '{"text": "%s", "n": 01}',  # invalid JSON after the text
        '{"text": "%s\\q"}',  # invalid escape
        '{"id": 1, "text": ["%s"]}',  # not a string
    ],
)
def test_bad_streamed_documents_are_reported_as_whole_ones(
    small_stream: None, bad: str, corpus_texts: list[str], tmp_path: Path
) -> None:
    body = json.dumps("".join(corpus_texts)[:20_000])[1:-1]
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n' + bad % body + "\n" + '{"text": "ok"}\n', encoding="utf-8")
    chunks, _ = plan_chunks([path])
    found = []
    for stream_bytes in (0, 2048):
        with pytest.raises(BadInputError) as e:
            list(iter_documents(chunks[0], keep_empty=True, stream_bytes=stream_bytes))
        log = ProblemLog()
        kept = list(
            iter_documents(
                chunks[0], keep_empty=True, stream_bytes=stream_bytes, on_error=OnError.SKIP,
                log=log,
            )
        )  # fmt: skip
        found.append((str(e.value), log.as_dict(), [d.text for d in kept]))
    assert found[0] == found[1]
    assert found[0][0].startswith(f"{path}:2: ")


def test_bad_utf8_in_a_streamed_text_file_is_reported_as_before(
    small_stream: None, corpus_texts: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes("".join(corpus_texts)[:10_000].encode() + b"\xed\xa0\x80 x")
    chunks, _ = plan_chunks([path])
    messages = []
    for stream_bytes in (0, 2048):
        with pytest.raises(BadInputError) as e:
            list(iter_documents(chunks[0], keep_empty=True, stream_bytes=stream_bytes))
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert "invalid UTF-8" in messages[0]


def test_long_lines_read_in_one_piece_across_chunks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Lines longer than the `readline` limit (64 bytes here) are read whole at their exact
    size, in every chunk of a file cut into 500-byte chunks, with true line numbers."""
    monkeypatch.setattr(readers, "_LONG_LINE", 64)
    texts = [f"w{i} " * (i * 7 % 97) for i in range(200)]
    path = tmp_path / "lines.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    chunks, _ = plan_chunks([path], chunk_bytes=500)
    assert len(chunks) > 10
    docs = [d for c in chunks for d in iter_documents(c, keep_empty=True, keep_raw=False)]
    assert [(d.text, d.line) for d in docs] == [(t, i + 1) for i, t in enumerate(texts)]
    assert all(d.raw is None for d in docs)


def _compress(data: bytes, suffix: str) -> bytes:
    import gzip

    import zstandard

    return gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_lines_are_the_plain_lines(
    suffix: str, corpus_texts: list[str], tmp_path: Path
) -> None:
    """Lines longer than a decompressed block (gathered without a second copy), lines inside
    one block, an empty line, with and without a final newline: exactly the plain lines."""
    long = json.dumps({"text": "".join(corpus_texts)[:50_000]}).encode()
    for end in (b"\n", b""):
        data = b"\n".join([long, b'{"text": "a"}', b"", b'{"text": "b"}', long, long]) + end
        path = tmp_path / f"c{len(end)}.jsonl{suffix}"
        path.write_bytes(_compress(data, suffix))
        for block in (97, 4096, 1 << 20):
            assert b"".join(readers.compressed_lines(path, block)) == data
            assert list(readers.compressed_lines(path, block)) == data.splitlines(keepends=True)


def test_compressed_inputs_preprocess_like_plain_ones(
    hf_tokenizer: Path, corpus_texts: list[str], tmp_path: Path
) -> None:
    """A `.jsonl.gz` / `.jsonl.zst` gives the `.bin`/`.idx` of the same `.jsonl` (a file
    ending in a newline used to yield an extra blank line, which preprocess refuses)."""
    data = "".join(json.dumps({"text": t}) + "\n" for t in corpus_texts[:20]).encode()
    outputs = []
    for suffix in ("", ".gz", ".zst"):
        path = tmp_path / f"in{suffix or '.plain'}.jsonl{suffix}"
        path.write_bytes(_compress(data, suffix) if suffix else data)
        prefix = tmp_path / f"out{suffix}"
        cfg = PreprocessConfig(
            inputs=[str(path)], output_prefix=str(prefix), tokenizer=str(hf_tokenizer),
            num_workers=1,
        )  # fmt: skip
        preprocess.preprocess(cfg)
        outputs.append(
            [indexed.bin_path(prefix).read_bytes(), indexed.idx_path(prefix).read_bytes()]
        )
    assert outputs[0] == outputs[1] == outputs[2]


BOUND_CONSTANT = 16 << 20
BOUND_PER_BYTE = 2.0


@pytest.mark.slow
def test_worker_peak_is_a_constant_plus_a_small_multiple_of_the_document(
    hf_tokenizer: Path, corpus_texts: list[str], tmp_path: Path
) -> None:
    """One 16 MiB JSONL document of mostly-ASCII text with an emoji every 32 characters (the
    worst case for Python's string layout: a whole-document `str` of it takes 4 bytes per
    input byte; the old path peaked at ~9 bytes per byte above the baseline). The preprocess
    call, in-process in a fresh interpreter with its libraries loaded by a warm-up run on a
    2 MiB document of the same text, may add at most 16 MiB + 2 bytes per document byte to
    the peak RSS (measured on the 2-core CI machine kind: 1.85 bytes per byte, 30 MiB; the
    old path: 10.4 bytes per byte, 166 MiB)."""
    code = "".join(corpus_texts).encode("ascii", "ignore").decode()
    text = "".join(code[i : i + 32] + "\U0001f600" for i in range(0, len(code), 32))
    size = 16 << 20
    line = json.dumps({"text": (text * (1 + size // len(text)))[:size]}, ensure_ascii=False)
    line = line.encode()[:size]
    cut = line.rfind(b"\xf0")  # end the text before a (possibly cut) emoji
    (tmp_path / "big.jsonl").write_bytes(line[:cut] + b'"}\n')
    warm = line[: 2 << 20]  # the same kind of text, streamed: first-use costs go in the base
    (tmp_path / "warm.jsonl").write_bytes(warm[: warm.rfind(b"\xf0")] + b'"}\n')
    nbytes = (tmp_path / "big.jsonl").stat().st_size
    extra = memory_probe.peaks(tmp_path, hf_tokenizer, ["warm.jsonl", "big.jsonl"])["big.jsonl"]
    bound = BOUND_CONSTANT + BOUND_PER_BYTE * nbytes
    assert extra <= bound, (
        f"peak RSS rose by {extra / 2**20:.1f} MiB for a {nbytes / 2**20:.1f} MiB document "
        f"({extra / nbytes:.2f} bytes per byte); bound {bound / 2**20:.1f} MiB"
    )
