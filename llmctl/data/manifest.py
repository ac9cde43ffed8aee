"""Manifests beside outputs, and the temporary-name-then-rename commit they rely on.

A dataset is complete exactly when its manifest exists and names it: outputs are written under
temporary names, the old manifest and index are removed first, the data files are renamed into
place, and the manifest is renamed last. A reader that finds `<prefix>.bin/.idx` without a
matching manifest is looking at an interrupted run.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from llmctl import __version__


def manifest_path(prefix: str | Path) -> Path:
    """The manifest that belongs to a dataset prefix (or any output path)."""
    return Path(f"{prefix}.manifest.json")


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON under a temporary name, then rename it into place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks (manifests record it per file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file, or None when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def upstream_report(paths: list[str], name: str) -> dict[str, Any] | None:
    """Parameters of the llmctl step that wrote these input files: its report `name` sits in
    that step's output folder (an input's folder or one above it) and names that folder.

    Returns the report's "params" plus its path and SHA-256 (so a later step's manifest says
    exactly which run it read), the report's own upstream records ("clean" in a dedup report)
    carried along, or None when no input came from such a step.
    """
    for entry in paths:
        path = Path(entry).resolve()
        folders = ([path] if path.is_dir() else []) + list(path.parents)[:3]
        for folder in folders:
            report = read_json(folder / name)
            if not report or not isinstance(report.get("params"), dict):
                continue
            if Path(str(report.get("output_dir"))).resolve() == folder:
                digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
                record = {**report["params"], "report": str(folder / name)}
                record["report_sha256"] = digest
                return record
    return None


def stamp() -> dict[str, str]:
    """Version and time fields every manifest carries."""
    return {
        "llmctl_version": __version__,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def commit(moves: list[tuple[Path, Path]], manifest_tmp: Path, manifest_final: Path) -> None:
    """Rename finished files into place, manifest last; remove stale outputs first."""
    manifest_final.unlink(missing_ok=True)
    for _, final in moves:
        final.unlink(missing_ok=True)
    for tmp, final in moves:
        os.replace(tmp, final)
    os.replace(manifest_tmp, manifest_final)
