"""Where `llmctl topo` gets its topology: the live machine, or a saved file.

A saved file is either `nvidia-smi topo -m` text or the JSON that `llmctl topo --json` printed;
a file whose first non-blank character is `{` is read as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from llmctl.errors import UserError
from llmctl.topology.model import Topology, topology_from_dict
from llmctl.topology.probe import probe
from llmctl.topology.smi import parse_topo_matrix


def load_topology(path: str | Path) -> Topology:
    """Read a saved `nvidia-smi topo -m` output or a saved `llmctl topo --json` probe.

    Raises:
        UserError: unreadable file, or content that is neither form (file, line, what was expected).
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read topology file ({e})") from None
    if text.lstrip().startswith("{"):
        return _from_json(text, str(path))
    return parse_topo_matrix(text, str(path))


def _from_json(text: str, source: str) -> Topology:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{source}: line {e.lineno}: expected JSON saved by `llmctl topo --json` ({e.msg})"
        ) from None
    try:
        return topology_from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(
            f"{source}: line 1: expected a topology object as `llmctl topo --json` writes it "
            f"(with source, gpus, nics, cpu), got an error at {e!s}"
        ) from None


def describe(
    from_file: str | Path | None = None,
    root: str | Path = "/",
    env: Mapping[str, str] | None = None,
) -> Topology:
    """The topology `llmctl topo` reports: a saved file if given, else a probe of this machine."""
    return load_topology(from_file) if from_file is not None else probe(root, env)
