"""Streaming document readers: JSONL (plain, .gz, .zst), Parquet, and plain text files.

Inputs are cut into chunks that workers read independently: an uncompressed JSONL file into
line-aligned byte ranges, a Parquet file into row groups, compressed files and text files
whole. A chunk owns exactly the lines that *start* inside its byte range, so chunks partition a
file with no line read twice or missed, and concatenating chunk outputs in chunk order gives
the same documents in the same order as one sequential pass.

Bad input follows issue 3 section 5: structural problems (invalid JSON or UTF-8, a missing or
non-string text field, an oversized document, an unreadable or truncated file) fail by default
or are skipped and counted with `on_error=skip`. Every problem is reported as `file:line: what`.

Empty and whitespace-only documents: with `keep_empty` (what `preprocess` uses, to match
Megatron-LM's preprocess_data.py, which tokenizes every record) they are yielded like any other,
and a blank JSONL line, which Megatron-LM cannot parse, is a structural problem; without it
(dedup, tokenizer training) they are skipped and counted as "empty document".

A compressed file that ends before its end-of-stream marker (a truncated download) is reported
as truncated, with the compressed byte offset and the last complete line; the partial line
before the cut is not parsed.

Memory (issue 12). With `stream_bytes`, a document larger than that (a text file, or a JSONL
line whose text field is one string) is not decoded into one `str`: its `Document.stream`
holds the input bytes once and yields the text in decoded segments of about 64 KiB, cut
where no UTF-8 sequence or JSON escape is split. Python stores a `str` at 1, 2 or 4 bytes per
character (4 for all of it once one character is above U+FFFF), so a whole-document `str` of
mostly-ASCII text with a few emoji costs 4 bytes per input byte, and decoding a JSONL line
holds the line, its decoded copy and the parsed text at once. The stream is checked in full
(UTF-8, JSON escapes, lone surrogates, the rest of the record) before the document is
yielded, so bad input is reported before any of its tokens are written; a record the
streaming path cannot take apart (the text not a top-level string field, say) goes the
ordinary way. Long JSONL lines are read in one allocation of their exact size (a plain
`readline` builds them from 8 KiB pieces and joins them: two copies at once).
"""

from __future__ import annotations

import io
import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from llmctl.errors import UserError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
COMPRESSED_SUFFIXES = (".gz", ".zst")
DEFAULT_MAX_DOC_BYTES = 64 << 20


class InputKind(StrEnum):
    """How a file holds documents."""

    JSONL = "jsonl"
    PARQUET = "parquet"
    TEXT = "text"


class OnError(StrEnum):
    """What to do with a structurally bad document."""

    FAIL = "fail"
    SKIP = "skip"


class Problem(StrEnum):
    """Kinds of bad input, as reported to the user."""

    INVALID_JSON = "invalid JSON"
    INVALID_UTF8 = "invalid UTF-8"
    MISSING_FIELD = "missing text field"
    NOT_STRING = "text field is not a string"
    TOO_LARGE = "document too large"
    UNREADABLE = "unreadable file"
    TRUNCATED = "truncated archive"
    BLANK_LINE = "blank line"
    EMPTY = "empty document"


class BadInputError(Exception):
    """A structural problem met under `on_error=fail`."""

    def __init__(self, path: str, line: int, problem: Problem, detail: str = "") -> None:
        self.path, self.line, self.problem, self.detail = path, line, problem, detail
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{path}:{line}: {problem.value}{extra}")

    def __reduce__(self) -> tuple[type, tuple[str, int, Problem, str]]:
        return (BadInputError, (self.path, self.line, self.problem, self.detail))


@dataclass(slots=True)
class ProblemLog:
    """Counts of bad input by kind, with the first few locations as examples."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    max_examples: int = 10

    def add(self, path: str, line: int, problem: Problem, detail: str = "") -> None:
        """Record one problem."""
        self.counts[problem.value] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(str(BadInputError(path, line, problem, detail)))

    def merge(self, other: ProblemLog) -> None:
        """Fold another log into this one."""
        self.counts.update(other.counts)
        room = self.max_examples - len(self.examples)
        self.examples.extend(other.examples[: max(room, 0)])

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"counts": dict(self.counts), "examples": list(self.examples)}


@dataclass(frozen=True, slots=True)
class Chunk:
    """A unit of work: a byte range of one JSONL file, row groups of one Parquet file, or
    a group of whole files."""

    index: int
    kind: InputKind
    paths: tuple[str, ...]
    start: int = 0
    end: int = -1
    num_bytes: int = 0
    compressed: bool = False
    line_base: int = 0


SEGMENT_BYTES = 1 << 16
"""Input bytes decoded per `TextStream` segment, about."""
_JSON_CUT = re.compile(rb"[^\\]{5}[\x00-\x5b\x5d-\x7f]")
"""A position (the last byte matched) that no JSON escape spans: an ASCII byte other than a
backslash, with no backslash in the five bytes before it (an escape is at most 6 bytes)."""
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class TextStream:
    """The text of a huge document as its input bytes, decoded a segment at a time.

    `data[start:end]` is UTF-8 text (a text file) or, with `escaped`, the body of a JSON
    string (a JSONL line's text field, between its quotes).
    """

    data: bytes
    start: int
    end: int
    escaped: bool = False

    def segments(self, segment_bytes: int = 0) -> Iterator[str]:
        """The text, in order, as `str` segments of about `segment_bytes` input bytes (0:
        `SEGMENT_BYTES`).

        Raises:
            UnicodeDecodeError, ValueError: the bytes are not valid UTF-8 / a valid JSON string
                body (`check` finds this first).
        """
        pos, step = self.start, segment_bytes or SEGMENT_BYTES
        while pos < self.end:
            cut = self._cut(pos + step)
            part = self.data[pos:cut]
            pos = cut
            text = part.decode("utf-8")
            del part
            yield json.loads(f'"{text}"') if self.escaped else text

    def _cut(self, target: int) -> int:
        """A cut at or after `target` that splits no UTF-8 sequence or JSON escape."""
        if target >= self.end:
            return self.end
        if self.escaped:
            m = _JSON_CUT.search(self.data, max(target - 5, self.start), self.end)
            return m.end() - 1 if m else self.end
        while target < self.end and self.data[target] & 0xC0 == 0x80:
            target += 1
        return target

    def check(self) -> bool:
        """Whether every segment decodes, with no lone surrogate escape (bounded memory)."""
        try:
            for seg in self.segments():
                if self.escaped and _has_lone_surrogate(seg):
                    return False
        except ValueError:  # UnicodeDecodeError and json.JSONDecodeError included
            return False
        return True


def _has_lone_surrogate(text: str) -> bool:
    # a paired surrogate escape decodes to one character above U+FFFF, never to a surrogate
    return not text.isascii() and _SURROGATE.search(text) is not None


@dataclass(frozen=True, slots=True)
class Document:
    """One document: its text, where it came from, and its raw record (JSONL line bytes).

    A huge document read with `stream_bytes` has `text == ""` and its text in `stream`.
    """

    text: str
    path: str
    line: int
    num_bytes: int
    raw: bytes | None = None
    stream: TextStream | None = None


def input_kind(path: Path) -> InputKind:
    """The kind of a file, from its suffixes."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in JSONL_SUFFIXES:
        return InputKind.JSONL
    if last == ".parquet":
        return InputKind.PARQUET
    return InputKind.TEXT


def _skipped(name: str) -> bool:
    """Hidden entries, and llmctl's own work folders and locks (an output written beside its
    inputs never becomes one of them)."""
    return name.startswith(".") or name.endswith((".llmctl-tmp", ".llmctl-lock"))


def discover(paths: list[str | Path]) -> list[Path]:
    """Expand files and folders (recursively, sorted, hidden entries skipped) into files.

    In a folder written by llmctl (an `llmctl data dedup` output), its reports are not inputs;
    llmctl's work folders (`*.llmctl-tmp`) and locks (`*.llmctl-lock`) are skipped everywhere.

    Raises:
        UserError: a path does not exist or a folder holds no files.
    """
    from llmctl.staging import metadata_files

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            meta = metadata_files(p)
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file()
                and not any(_skipped(part) for part in f.relative_to(p).parts)
                and str(f.relative_to(p)) not in meta
            )
            if not found:
                raise UserError(f"input folder {p} holds no files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"input {p} does not exist")
    return files


def _is_compressed(path: Path) -> bool:
    return path.suffix.lower() in COMPRESSED_SUFFIXES


@dataclass(frozen=True, slots=True)
class FileScan:
    """One pass over an input file: its checksum and, for uncompressed JSONL, line-aligned
    byte ranges of about `chunk_bytes` with the number of lines before each."""

    path: Path
    num_bytes: int
    sha256: str
    ranges: tuple[tuple[int, int, int], ...]


def scan_file(path: Path, chunk_bytes: int) -> FileScan:
    """Hash a file and, for uncompressed JSONL, find its chunk boundaries in the same read.

    A boundary is the start of the first line beginning at or after each `chunk_bytes` step,
    so every range holds whole lines; the lines before each range are counted on the way so
    that workers report true line numbers.
    """
    import hashlib

    digest, size = hashlib.sha256(), path.stat().st_size
    split = input_kind(path) is InputKind.JSONL and not _is_compressed(path)
    ranges: list[tuple[int, int, int]] = []
    start, start_line, offset, lines = 0, 0, 0, 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            target = start + chunk_bytes
            while split and target < offset + len(block):
                nl = block.find(b"\n", max(target - offset - 1, 0))
                if nl < 0 or offset + nl + 1 >= size:
                    break
                ranges.append((start, offset + nl + 1, start_line))
                start, start_line = offset + nl + 1, lines + block.count(b"\n", 0, nl + 1)
                target = start + chunk_bytes
            lines += block.count(b"\n")
            offset += len(block)
    ranges.append((start, -1, start_line))
    return FileScan(path, size, digest.hexdigest(), tuple(ranges))


def _parquet_groups(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).num_row_groups)
    except Exception as e:
        raise UserError(f"{path}: not a readable Parquet file ({e})") from e


MIN_CHUNK_BYTES = 1 << 20
CHUNKS_PER_SMALL_INPUT = 64


def chunk_size(files: list[Path], max_chunk_bytes: int) -> int:
    """Chunk size for these inputs: `max_chunk_bytes`, or less for a small input so that it
    still splits into up to 64 chunks (at least 1 MiB each) and every worker gets work.

    It depends on the input only, never on the worker count, so a run resumed with another
    worker count keeps its finished chunks.
    """
    total = sum(f.stat().st_size for f in files)
    return max(min(max_chunk_bytes, total // CHUNKS_PER_SMALL_INPUT), MIN_CHUNK_BYTES)


def plan_chunks(
    files: list[Path], chunk_bytes: int = 32 << 20
) -> tuple[list[Chunk], list[FileScan]]:
    """Cut input files into chunks of about `chunk_size(files, chunk_bytes)`, in input order;
    hash every file.

    Text files are grouped until a group reaches the chunk size; a Parquet file gives one
    chunk per row group; a compressed JSONL file is one chunk. A `chunk_bytes` below 1 MiB is
    used as given (fine-grained chunks for tests).
    """
    chunk_bytes = chunk_size(files, chunk_bytes) if chunk_bytes >= MIN_CHUNK_BYTES else chunk_bytes
    chunks: list[Chunk] = []
    scans = [scan_file(f, chunk_bytes) for f in files]
    group: list[FileScan] = []

    def flush() -> None:
        if group:
            paths = tuple(str(g.path) for g in group)
            n = sum(g.num_bytes for g in group)
            chunks.append(Chunk(len(chunks), InputKind.TEXT, paths, num_bytes=n))
            group.clear()

    for scan in scans:
        kind = input_kind(scan.path)
        if kind is InputKind.TEXT:
            group.append(scan)
            if sum(g.num_bytes for g in group) >= chunk_bytes:
                flush()
            continue
        flush()
        path = (str(scan.path),)
        if kind is InputKind.PARQUET:
            n = _parquet_groups(scan.path)
            for g in range(n):
                chunks.append(Chunk(len(chunks), kind, path, g, g + 1, scan.num_bytes // n))
            continue
        for start, end, line_base in scan.ranges:
            n = (scan.num_bytes if end < 0 else end) - start
            compressed = _is_compressed(scan.path)
            chunks.append(Chunk(len(chunks), kind, path, start, end, n, compressed, line_base))
    flush()
    return chunks, scans


class TruncatedError(Exception):
    """A compressed stream that stops before its end-of-stream marker."""

    def __init__(self, fmt: str, offset: int) -> None:
        self.fmt, self.offset = fmt, offset
        super().__init__(f"{fmt} stream ends at byte {offset} without its end marker")


def _decompressor(fmt: str) -> Any:
    if fmt == "gzip":
        return zlib.decompressobj(wbits=31)
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj()


def decompressed_blocks(path: str | Path, block_bytes: int = 1 << 16) -> Iterator[bytes]:
    """The decompressed bytes of a `.gz` or `.zst` file (several members or frames allowed).

    Raises:
        TruncatedError: the file ends inside a member or frame.
    """
    fmt = "gzip" if Path(path).suffix.lower() == ".gz" else "zstd"
    dobj, started, offset = _decompressor(fmt), False, 0
    with open(path, "rb") as raw:
        while block := raw.read(block_bytes):
            offset += len(block)
            while block:
                started = True
                if out := dobj.decompress(block):
                    yield out
                block = b""
                if dobj.eof:
                    block = dobj.unused_data
                    dobj, started = _decompressor(fmt), False
    if started:
        raise TruncatedError(fmt, offset)


def compressed_lines(path: str | Path, block_bytes: int = 1 << 16) -> Iterator[bytes]:
    """Lines (with their newline) of a compressed file; a partial line before a truncation is
    dropped and `TruncatedError` raised.

    A line longer than a decompressed block is gathered in a `BytesIO` whose buffer becomes
    the line without a copy (joining the pieces would hold the line twice).
    """
    tail = io.BytesIO()
    for block in decompressed_blocks(path, block_bytes):
        if b"\n" not in block:
            tail.write(block)
            continue
        parts = block.split(b"\n")
        del block
        rest = parts.pop()  # after the block's last newline: the start of the next line
        if tail.tell():
            tail.write(parts[0])
            tail.write(b"\n")
            parts[0] = b""
            yield tail.getvalue()
            tail = io.BytesIO()
            parts = parts[1:]
        for part in parts:
            yield part + b"\n"
        del parts
        tail.write(rest)
    if tail.tell():
        yield tail.getvalue()


class _Reporter:
    """Applies the error policy to one chunk's problems."""

    def __init__(self, on_error: OnError | str, log: ProblemLog) -> None:
        self.on_error, self.log = OnError(on_error), log

    def __call__(self, path: str, line: int, problem: Problem, detail: str = "") -> None:
        if problem is not Problem.EMPTY and self.on_error is OnError.FAIL:
            raise BadInputError(path, line, problem, detail)
        self.log.add(path, line, problem, detail)


def _jsonl_text(box: list[bytes], text_field: str) -> tuple[str | None, Problem | None, str]:
    """The text field of the line in `box` (taken out of it, so the line can be freed once
    decoded: only the decoded line and the parsed text exist together)."""
    try:
        decoded = box.pop().decode("utf-8")
    except UnicodeDecodeError as e:
        return None, Problem.INVALID_UTF8, f"byte {e.start}"
    try:
        record = json.loads(decoded)
    except json.JSONDecodeError as e:
        return None, Problem.INVALID_JSON, e.msg
    if not isinstance(record, dict):
        kind = "an array" if isinstance(record, list) else f"a {type(record).__name__}"
        return None, Problem.MISSING_FIELD, f"{text_field!r}: the line is {kind}, not an object"
    if text_field not in record:
        return None, Problem.MISSING_FIELD, repr(text_field)
    text = record[text_field]
    if not isinstance(text, str):
        return None, Problem.NOT_STRING, type(text).__name__
    surrogate_escape = "\\ud" in decoded or "\\uD" in decoded
    del decoded, record
    if surrogate_escape and (at := _lone_surrogate(text)) is not None:
        return None, Problem.INVALID_UTF8, f"lone surrogate escape at character {at}"
    return text, None, ""


def _lone_surrogate(text: str) -> int | None:
    """Index of a lone surrogate (a JSON escape like \\ud800 that is not valid Unicode text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


_SPAN_MARK = rb"\u0000llmctl-span\u0000"
_KEY_END = re.compile(rb'\s*:\s*"')


def _text_stream(raw: bytes, text_field: str) -> TextStream | None:
    """The text field of a JSONL line as a checked `TextStream`, or None where the line is
    not a valid record whose top-level `text_field` is a string found here (the caller then
    parses it whole, which also names the problem).

    The field's string is located by its key; the rest of the record (the line with that
    string replaced by a mark) is parsed with `json.loads`, which must find the mark under
    `text_field`, so the located string is the one the parser would return.
    """
    key = json.dumps(text_field).encode()
    at, m = raw.find(key), None
    while at >= 0 and (m := _KEY_END.match(raw, at + len(key))) is None:
        at = raw.find(key, at + 1)  # that was a value, say {"kind": "text", "text": ...}
    if m is None:
        return None
    start = end = m.end()
    while (end := raw.find(b'"', end)) >= 0:
        k = end
        while raw[k - 1] == 0x5C:  # a quote after an odd run of backslashes is escaped
            k -= 1
        if (end - k) % 2 == 0:
            break
        end += 1
    if end < 0:
        return None
    try:
        record = json.loads(b"".join([raw[:start], _SPAN_MARK, raw[end:]]).decode())
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get(text_field) != "\x00llmctl-span\x00":
        return None
    stream = TextStream(raw, start, end, escaped=True)
    return stream if stream.check() else None


_LONG_LINE = 1 << 20


def _read_line(f: IO[bytes]) -> bytes:
    """The next line; a long one read in one allocation of its exact size."""
    head = f.readline(_LONG_LINE)
    if len(head) < _LONG_LINE or head.endswith(b"\n"):
        return head
    start, n = f.tell() - len(head), len(head)
    del head
    while block := f.read(1 << 20):
        nl = block.find(b"\n")
        n += len(block) if nl < 0 else nl + 1
        if nl >= 0:
            break
    f.seek(start)
    return f.read(n)


def _jsonl_lines(chunk: Chunk) -> Iterator[list[bytes]]:
    """The chunk's lines, each in a one-element list that the reader empties (so no frame here
    keeps a huge line alive once the reader has let go of it)."""
    path = chunk.paths[0]
    if chunk.compressed:
        for line in compressed_lines(path):
            box = [line]
            del line
            yield box
        return
    with open(path, "rb") as f:
        if chunk.start:
            f.seek(chunk.start)
        pos = chunk.start
        while not 0 <= chunk.end <= pos:
            box = [_read_line(f)]
            if not box[0]:
                break
            pos += len(box[0])
            yield box


def _iter_jsonl(
    chunk: Chunk,
    text_field: str,
    report: _Reporter,
    opts: _ReadOptions,
) -> Iterator[Document]:
    path, line = chunk.paths[0], chunk.line_base
    try:
        for box in _jsonl_lines(chunk):
            line += 1
            size = len(box[0])
            if size > opts.max_doc_bytes:
                report(path, line, Problem.TOO_LARGE, f"{size} bytes > {opts.max_doc_bytes}")
                continue
            if not box[0] or box[0].isspace():
                if opts.keep_empty:
                    report(path, line, Problem.BLANK_LINE, "not a JSON record")
                else:
                    report(path, line, Problem.EMPTY, "blank line")
                continue
            if 0 < opts.stream_bytes < size and opts.keep_empty:
                stream = _text_stream(box[0], text_field)
                if stream is not None:
                    box.clear()
                    yield Document("", path, line, size, None, stream)
                    continue
            raw = box[0] if opts.keep_raw else None
            text, problem, detail = _jsonl_text(box, text_field)
            if text is None:
                report(path, line, problem or Problem.INVALID_JSON, detail)
            elif not opts.keep_empty and not text.strip():
                report(path, line, Problem.EMPTY)
            else:
                yield Document(text, path, line, size, raw)
            del text, raw
    except TruncatedError as e:
        report(path, line + 1, Problem.TRUNCATED, f"{e}; lines up to {line} were read")


def _iter_parquet(
    chunk: Chunk, text_field: str, report: _Reporter, keep_empty: bool
) -> Iterator[Document]:
    import pyarrow.parquet as pq

    path = chunk.paths[0]
    pf = pq.ParquetFile(path)
    if text_field not in pf.schema_arrow.names:
        report(path, 0, Problem.MISSING_FIELD, f"no column {text_field!r}")
        return
    row0 = sum(pf.metadata.row_group(g).num_rows for g in range(chunk.start))
    for g in range(chunk.start, chunk.end):
        column = pf.read_row_group(g, columns=[text_field]).column(0).to_pylist()
        for i, text in enumerate(column):
            line = row0 + i + 1
            if not isinstance(text, str):
                report(path, line, Problem.NOT_STRING, type(text).__name__)
            elif not keep_empty and not text.strip():
                report(path, line, Problem.EMPTY)
            else:
                yield Document(text, path, line, len(text.encode("utf-8")))
        row0 += len(column)


def _read_whole(path: str) -> bytes:
    if not _is_compressed(Path(path)):
        return Path(path).read_bytes()
    return b"".join(decompressed_blocks(path))


def _iter_text(chunk: Chunk, report: _Reporter, opts: _ReadOptions) -> Iterator[Document]:
    for path in chunk.paths:
        try:
            size = Path(path).stat().st_size
            if size > opts.max_doc_bytes:
                report(path, 1, Problem.TOO_LARGE, f"{size} bytes > {opts.max_doc_bytes}")
                continue
            data = _read_whole(path)
        except TruncatedError as e:
            report(path, 1, Problem.TRUNCATED, str(e))
            continue
        except (OSError, zlib.error) as e:
            report(path, 0, Problem.UNREADABLE, getattr(e, "strerror", None) or str(e))
            continue
        if 0 < opts.stream_bytes < len(data) and opts.keep_empty:
            stream = TextStream(data, 0, len(data))
            if stream.check():
                yield Document("", path, 1, len(data), None, stream)
                continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            report(path, data[: e.start].count(b"\n") + 1, Problem.INVALID_UTF8, f"byte {e.start}")
            continue
        if not opts.keep_empty and not text.strip():
            report(path, 1, Problem.EMPTY)
            continue
        yield Document(text, path, 1, len(data), data if opts.keep_raw else None)


@dataclass(frozen=True, slots=True)
class _ReadOptions:
    max_doc_bytes: int
    keep_empty: bool
    keep_raw: bool
    stream_bytes: int


def iter_documents(
    chunk: Chunk,
    *,
    text_field: str = "text",
    on_error: OnError | str = OnError.FAIL,
    log: ProblemLog | None = None,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
    keep_empty: bool = False,
    keep_raw: bool = True,
    stream_bytes: int = 0,
) -> Iterator[Document]:
    """Yield the good documents of one chunk, in order; record or raise on bad ones.

    Args:
        chunk: the work unit to read.
        text_field: JSONL key or Parquet column holding the text.
        on_error: fail (raise on the first structural problem) or skip (count it).
        log: where skipped problems are counted.
        max_doc_bytes: larger records are bad input.
        keep_empty: yield empty and whitespace-only documents (Megatron-LM's rule) instead of
            skipping and counting them; blank JSONL lines are then bad input.
        keep_raw: keep each record's input bytes in `Document.raw` (dedup copies them out);
            without it a JSONL line is freed as soon as it is decoded.
        stream_bytes: with `keep_empty`, documents larger than this (input bytes) come as a
            `Document.stream` of decoded segments instead of one `str` (0: never).

    Raises:
        BadInputError: a structural problem under `on_error=fail`.
    """
    report = _Reporter(on_error, log if log is not None else ProblemLog())
    opts = _ReadOptions(max_doc_bytes, keep_empty, keep_raw, stream_bytes)
    try:
        if chunk.kind is InputKind.JSONL:
            yield from _iter_jsonl(chunk, text_field, report, opts)
        elif chunk.kind is InputKind.PARQUET:
            yield from _iter_parquet(chunk, text_field, report, keep_empty)
        else:
            yield from _iter_text(chunk, report, opts)
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, OSError) and chunk.kind is InputKind.TEXT:
            raise
        report(chunk.paths[0], 0, Problem.UNREADABLE, str(e))
