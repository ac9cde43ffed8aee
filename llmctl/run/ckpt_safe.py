"""Safe reading of torch's `.metadata` file in a torch_dist checkpoint.

Why: torch's `FileSystemReader.read_metadata` unpickles `.metadata` with plain `pickle.load`,
which runs any callable a crafted file names. Before megatron-core loads a checkpoint, llmctl
unpickles the same file with an allowlist (torch's checkpoint metadata dataclasses and enums,
`torch.Size`, dtypes, layouts, memory formats); a file that names anything else is rejected.
Every other deserialization in a load runs under `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` (see
`weights_only_loads`), and llmctl's own state is JSON.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_DCP_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint.filesystem",
)
_ALLOWED_FUNCS = {("torch.serialization", "_get_layout")}  # maps a layout name to torch.layout


class UnsafePickleError(ValueError):
    """A pickle names a global outside the allowlist."""


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _ALLOWED_FUNCS:
            return super().find_class(module, name)
        if not module.startswith(("torch", "collections")):
            raise UnsafePickleError(f"refusing to unpickle {module}.{name}")
        obj = super().find_class(module, name)
        if module in _DCP_MODULES and isinstance(obj, type):
            return obj
        if module == "torch" and (
            obj is torch.Size or isinstance(obj, torch.dtype | torch.layout | torch.memory_format)
        ):
            return obj
        if (module, name) == ("collections", "OrderedDict"):
            return obj
        raise UnsafePickleError(f"refusing to unpickle {module}.{name}")


def load_metadata(path: Path) -> Any:
    """Unpickle a `.metadata` file with the allowlist.

    Raises:
        UnsafePickleError: If the file names a global outside the allowlist.
    """
    with open(path, "rb") as f:
        return _Restricted(f).load()


def shard_files_in_metadata(data: bytes) -> set[str]:
    """Relative paths of every shard file a `.metadata` (its bytes) refers to.

    Raises:
        UnsafePickleError: If the file names a global outside the allowlist.
    """
    md = _Restricted(io.BytesIO(data)).load()
    return {info.relative_path for info in (md.storage_data or {}).values()}


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Force `torch.load(weights_only=True)` for every load inside (megatron's common.pt)."""
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old
