"""A demo corpus every machine already has: the Python standard library's source files.

No download, no shipped data: `sysconfig.get_paths()["stdlib"]` holds a few thousand `.py`
files on any CPython install. Files are listed by relative path (site-packages excluded, so
installed packages do not change the corpus), evenly sampled down to `max_docs`, and written as
JSONL records `{"text": ..., "source": <relative path>}` in that fixed order. The corpus
naturally contains near-duplicates (for example the generated `encodings/cp*.py` codecs),
which gives the dedup step real work.
"""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path


def stdlib_sources(max_file_bytes: int = 200_000) -> list[tuple[str, Path]]:
    """(relative path, path) of every stdlib `.py` file, sorted, site-packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        if f.is_file() and 0 < f.stat().st_size <= max_file_bytes:
            found.append((rel, f))
    return sorted(found)


def build_demo_corpus(out_path: str | Path, max_docs: int | None = 1500) -> dict[str, int]:
    """Write the demo corpus as JSONL at `out_path` (atomically); return its counts.

    Args:
        out_path: the JSONL file to write.
        max_docs: keep this many files, evenly spaced over the sorted list (None: all).
    """
    sources = stdlib_sources()
    if max_docs is not None and len(sources) > max_docs:
        step = len(sources) / max_docs
        sources = [sources[int(i * step)] for i in range(max_docs)]
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.llmctl-partial-{os.getpid()}")
    num_docs = num_bytes = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for rel, path in sources:
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip():
                    continue
                line = json.dumps({"text": text, "source": rel}, ensure_ascii=False)
                f.write(line + "\n")
                num_docs += 1
                num_bytes += len(line) + 1
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"num_docs": num_docs, "num_bytes": num_bytes}


def is_demo_corpus(path: Path) -> bool:
    """Whether `path` looks like a corpus this module wrote (its first line a JSON record with
    exactly the keys `text` and `source`) or is empty (nothing to lose)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return False
    if not first:
        return path.stat().st_size == 0
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and set(record) == {"text", "source"}
