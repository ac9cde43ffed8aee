"""Writers that copy records in their input's format (JSONL, Parquet, text files)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import IO, Any

from llmctl.data.readers import Document, InputKind


def open_binary_write(path: Path) -> IO[bytes]:
    """Open for writing, compressing as the suffix says (.gz, .zst)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "wb")  # type: ignore[return-value]
    if suffix == ".zst":
        import zstandard

        raw = open(path, "wb")  # noqa: SIM115 (owned by the writer)
        return zstandard.ZstdCompressor().stream_writer(raw, closefd=True)
    return open(path, "wb")


class RecordWriter:
    """Appends kept documents to one output file in the input's format."""

    def __init__(self, path: Path, kind: InputKind, text_field: str) -> None:
        self.path, self.kind, self.text_field = path, kind, text_field
        self._f: IO[bytes] | None = None
        self._rows: list[str] = []
        if kind is InputKind.JSONL:
            self._f = open_binary_write(path)

    def write(self, doc: Document) -> None:
        """Write one record."""
        if self.kind is InputKind.JSONL:
            assert self._f is not None and doc.raw is not None
            self._f.write(doc.raw if doc.raw.endswith(b"\n") else doc.raw + b"\n")
        elif self.kind is InputKind.TEXT:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(doc.path, self.path)
        else:
            self._rows.append(doc.text)

    def close(self) -> None:
        """Flush and close (Parquet is written here, text column only)."""
        if self._f is not None:
            self._f.close()
        if self.kind is InputKind.PARQUET:
            import pyarrow as pa
            import pyarrow.parquet as pq

            self.path.parent.mkdir(parents=True, exist_ok=True)
            table: Any = pa.table({self.text_field: self._rows})
            pq.write_table(table, self.path)
