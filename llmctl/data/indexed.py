"""Megatron's indexed dataset format (`.bin` + `.idx`), written by llmctl.

Why our own writer and not megatron-core's `IndexedDatasetBuilder`: the builder keeps every
sequence length in a Python list and merges shards by loading whole indices, so memory grows
with the corpus; it also imports torch. Here each worker writes a bounded shard and the merge
streams shard by shard, so peak memory depends on the largest shard, not on the corpus.

The bytes are Megatron's, field for field (little endian)::

    b"MMIDIDX\\x00\\x00"            9-byte magic
    u64 1                           version
    u8  dtype code                  DType enum: uint8=1 ... int32=4 ... uint16=8
    u64 num_sequences
    u64 num_documents + 1           length of the document index array
    int32[num_sequences]            tokens per sequence
    int64[num_sequences]            byte offset of each sequence in .bin
    int64[num_documents + 1]        sequence index at which each document starts (0 first)

llmctl writes one sequence per non-empty document (no sentence splitting). A document with no
tokens (empty text; no EOD is appended to it, as in Megatron-LM) has no sequence but still an
entry in the document index, which then repeats the previous value, exactly as megatron-core's
`IndexedDatasetBuilder.add_document([], [])` records it. Writers take per-document token
counts where 0 marks such a document. The token dtype follows Megatron: uint16 when the
vocabulary has fewer than 65500 entries, int32 otherwise.
"""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER_BYTES = len(INDEX_MAGIC) + 8 + 1 + 8 + 8
_DTYPE_CODES: dict[type, int] = {
    np.uint8: 1,
    np.int8: 2,
    np.int16: 3,
    np.int32: 4,
    np.int64: 5,
    np.float64: 6,
    np.float32: 7,
    np.uint16: 8,
}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


def token_dtype(vocab_size: int) -> type:
    """Token dtype for a vocabulary, as Megatron's `DType.optimal_dtype` chooses it."""
    return np.uint16 if vocab_size < 65500 else np.int32


def bin_path(prefix: str | Path) -> Path:
    """The `.bin` path of a dataset prefix."""
    return Path(f"{prefix}.bin")


def idx_path(prefix: str | Path) -> Path:
    """The `.idx` path of a dataset prefix."""
    return Path(f"{prefix}.idx")


@dataclass(frozen=True, slots=True)
class IndexHeader:
    """The fixed-size head of an `.idx` file."""

    dtype: type
    num_sequences: int
    num_doc_indices: int


def _write_header(f: BinaryIO, dtype: type, num_sequences: int, num_doc_indices: int) -> None:
    f.write(INDEX_MAGIC)
    f.write(struct.pack("<Q", INDEX_VERSION))
    f.write(struct.pack("<B", _DTYPE_CODES[dtype]))
    f.write(struct.pack("<Q", num_sequences))
    f.write(struct.pack("<Q", num_doc_indices))


def read_header(prefix: str | Path) -> IndexHeader:
    """Read and check the head of `<prefix>.idx`.

    Raises:
        ValueError: the file is not a Megatron index.
    """
    with open(idx_path(prefix), "rb") as f:
        head = f.read(_HEADER_BYTES)
    if len(head) != _HEADER_BYTES or head[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise ValueError(f"{idx_path(prefix)} is not a Megatron index (bad magic)")
    version, code, num_seq, num_doc = struct.unpack("<QBQQ", head[len(INDEX_MAGIC) :])
    if version != INDEX_VERSION or code not in _CODE_DTYPES:
        raise ValueError(f"{idx_path(prefix)}: unsupported version {version} or dtype {code}")
    return IndexHeader(_CODE_DTYPES[code], num_seq, num_doc)


def read_lengths(prefix: str | Path) -> np.ndarray:
    """Sequence lengths (int32) of a dataset, read without loading the rest."""
    head = read_header(prefix)
    return np.fromfile(
        idx_path(prefix), dtype=np.int32, count=head.num_sequences, offset=_HEADER_BYTES
    )


def read_doc_indices(prefix: str | Path) -> np.ndarray:
    """The document index (int64, num_documents + 1 entries) of a dataset."""
    head = read_header(prefix)
    offset = _HEADER_BYTES + head.num_sequences * (4 + 8)
    return np.fromfile(idx_path(prefix), dtype=np.int64, count=head.num_doc_indices, offset=offset)


def read_documents(prefix: str | Path) -> list[np.ndarray]:
    """Every document's tokens. For tests and small datasets only (loads everything)."""
    head = read_header(prefix)
    lengths = read_lengths(prefix)
    tokens: np.ndarray = np.fromfile(bin_path(prefix), dtype=head.dtype)
    bounds = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return [tokens[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]


class ShardWriter:
    """Writes one bounded shard: tokens streamed to `.bin`, lengths kept until `close()`."""

    def __init__(self, prefix: str | Path, dtype: type) -> None:
        self.prefix = Path(prefix)
        self.dtype = dtype
        self._bin = open(bin_path(prefix), "wb")  # noqa: SIM115 (closed in close())
        self._lengths: list[np.ndarray] = []

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents given as one flat token array and per-document lengths (a 0 is a
        document without tokens: a document-index entry, no sequence)."""
        self.add_tokens(tokens)
        self.add_lengths(lengths)

    def add_tokens(self, tokens: np.ndarray) -> None:
        """Append token ids to `.bin` (any part of the stream; `add_lengths` says where
        documents end)."""
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)  # no copy

    def add_lengths(self, lengths: np.ndarray) -> None:
        """Record documents by their token counts (0: a document without tokens); their
        tokens are the next ones given to `add_tokens`, before or after this call."""
        self._lengths.append(np.asarray(lengths, dtype=np.int32))

    def close(self) -> int:
        """Write the `.idx`; return the number of documents (empty ones included)."""
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        write_index(self.prefix, self.dtype, [lengths])
        return len(lengths)


def _pointers(lengths: np.ndarray, itemsize: int, base: int) -> np.ndarray:
    ptr = np.empty(len(lengths), dtype=np.int64)
    if len(lengths):
        ptr[0] = 0
        np.cumsum(lengths[:-1], dtype=np.int64, out=ptr[1:])
        ptr *= itemsize
    return ptr + base


def _write_doc_indices(f: BinaryIO, doc_lengths: list[np.ndarray], base: int = 0) -> int:
    """Write the document index entries after the leading 0 (one per document: sequences so
    far, counting from `base`); return the sequence count reached."""
    for part in doc_lengths:
        f.write((np.cumsum(np.asarray(part) > 0, dtype=np.int64) + base).tobytes())
        base += int(np.count_nonzero(part))
    return base


def write_index(prefix: str | Path, dtype: type, length_parts: list[np.ndarray]) -> None:
    """Write `<prefix>.idx` for documents whose token counts (0: empty document) arrive in
    parts (one per shard)."""
    seq_parts = [np.asarray(p, dtype=np.int32) for p in length_parts]
    seq_parts = [p[p > 0] for p in seq_parts]
    num_seq = sum(len(p) for p in seq_parts)
    num_docs = sum(len(p) for p in length_parts)
    itemsize = np.dtype(dtype).itemsize
    with open(idx_path(prefix), "wb") as f:
        _write_header(f, dtype, num_seq, num_docs + 1)
        for part in seq_parts:
            f.write(part.tobytes())
        base = 0
        for part in seq_parts:
            f.write(_pointers(part, itemsize, base).tobytes())
            base += int(np.sum(part, dtype=np.int64)) * itemsize
        f.write(np.zeros(1, np.int64).tobytes())
        _write_doc_indices(f, length_parts)


def merge_shards(shards: list[Path], out_prefix: str | Path, dtype: type) -> None:
    """Concatenate shard datasets, in order, into `out_prefix`, streaming.

    Memory holds one shard's lengths at a time (twice: once for lengths, once for pointers).
    """
    heads = [read_header(s) for s in shards]
    num_seq = sum(h.num_sequences for h in heads)
    num_docs = sum(h.num_doc_indices - 1 for h in heads)
    itemsize = np.dtype(dtype).itemsize
    with open(bin_path(out_prefix), "wb") as out:
        for s in shards:
            with open(bin_path(s), "rb") as f:
                shutil.copyfileobj(f, out, 16 << 20)
    with open(idx_path(out_prefix), "wb") as f:
        _write_header(f, dtype, num_seq, num_docs + 1)
        for s in shards:
            f.write(read_lengths(s).tobytes())
        base = 0
        for s in shards:
            lengths = read_lengths(s)
            f.write(_pointers(lengths, itemsize, base).tobytes())
            base += int(np.sum(lengths, dtype=np.int64)) * itemsize
        f.write(np.zeros(1, np.int64).tobytes())
        seq_base = 0
        for s, head in zip(shards, heads, strict=True):
            f.write((read_doc_indices(s)[1:] + seq_base).tobytes())
            seq_base += head.num_sequences
