"""Pieces every launcher renders the same way: process shape, torchrun prefix, environment.

Pure functions of the configuration and the layout; nothing here starts a process.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from llmctl.errors import UserError

ENTRY_MODULE = "llmctl.train.entry"
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """How many nodes and processes a launch starts."""

    num_nodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        """Total ranks."""
        return self.num_nodes * self.nproc_per_node


def layout_of(cfg: Any, layout: Any | None) -> Any:
    """The given layout, or the one the configuration alone implies (DP defaults to 1)."""
    if layout is not None:
        return layout
    from llmctl.train.layout import resolve_layout

    return resolve_layout(cfg)


def launch_shape(cfg: Any, layout: Any, num_nodes: int) -> Shape:
    """Processes per node for `num_nodes` nodes, checked against the layout's world size.

    Raises:
        UserError: The layout's world size cannot be split evenly over the nodes, or disagrees
            with `launcher.nproc_per_node`, or asks for more ranks than a node has GPUs.
    """
    world = layout.world_size
    product = f"TP*PP*CP*DP = {layout.tp}*{layout.pp}*{layout.cp}*{layout.dp} = {world}"
    nproc = cfg.launcher.nproc_per_node
    if nproc is None:
        if world % num_nodes:
            raise UserError(
                f"the layout needs {product} ranks, not divisible over {num_nodes} nodes; "
                "change parallel.dp or cluster.num_nodes (--nodes)"
            )
        nproc = world // num_nodes
    if nproc < 1 or nproc * num_nodes != world:
        raise UserError(
            f"launcher.nproc_per_node={nproc} x {num_nodes} node(s) = {nproc * num_nodes} "
            f"processes, but the layout needs {product}; fix launcher.nproc_per_node or parallel.*"
        )
    if cfg.cluster.device == "cuda" and nproc > cfg.cluster.gpus_per_node:
        raise UserError(
            f"{nproc} ranks per node ({product} over {num_nodes} node(s)) but "
            f"cluster.gpus_per_node={cfg.cluster.gpus_per_node}; add nodes (--nodes) or "
            "shrink the layout"
        )
    return Shape(num_nodes=num_nodes, nproc_per_node=nproc)


def python_of(cfg: Any) -> str:
    """The interpreter that runs torchrun: `launcher.python`, else this one."""
    return str(cfg.launcher.python or sys.executable)


def torchrun_prefix(python: str) -> list[str]:
    """`torchrun` called through a known interpreter (a bare `torchrun` may not be on PATH)."""
    return [python, "-m", "torch.distributed.run"]


def entry_args(run_dir: str | Path) -> list[str]:
    """The training entry point and its one argument, the run directory."""
    return ["-m", ENTRY_MODULE, str(run_dir)]


def launch_env(cfg: Any, shape: Shape) -> dict[str, str]:
    """Environment set for every rank: device defaults, then `launcher.env` on top.

    Secrets are not here: they pass by name from the caller's environment.

    Raises:
        UserError: A malformed variable name, or a secret also given a value in launcher.env.
    """
    check_env_names(cfg)
    # torch 2.13: when workers share the agent's rendezvous TCP store, a restarted agent
    # deadlocks in re-rendezvous (multi-node) and a restarted gloo rank can read its dead
    # peer's old address (single node); see docs/launch.md, "Failure and restarts".
    env = {"PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if cfg.cluster.device == "cuda":
        env.update(
            CUDA_DEVICE_MAX_CONNECTIONS="1",  # megatron's TP/SP comm overlap needs in-order kernels
            TORCH_NCCL_ASYNC_ERROR_HANDLING="1",  # a failed collective aborts instead of hanging
            TORCH_NCCL_AVOID_RECORD_STREAMS="1",  # frees comm buffers sooner (less reserved)
            NCCL_DEBUG="WARN",
        )
    else:
        cores = cfg.cluster.cpu_cores or 1
        env["OMP_NUM_THREADS"] = str(max(1, cores // shape.nproc_per_node))
        # large CPU tensors on 2 MiB pages: the fork of an async checkpoint save copies far
        # fewer page-table entries (measured: blocked time 75 -> 35 ms for 1.1 GiB of state)
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    env.update({str(k): str(v) for k, v in cfg.launcher.env.items()})
    return env


def check_env_names(cfg: Any) -> None:
    """Check launcher.env keys and launcher.secrets names.

    Raises:
        UserError: A name that is not a shell variable name, or a secret with a value in the
            config (it would be written into scripts and logs).
    """
    for name in [*cfg.launcher.env, *cfg.launcher.secrets]:
        if not _ENV_NAME_RE.match(str(name)):
            raise UserError(f"{name!r} in launcher.env/launcher.secrets is not a variable name")
    both = sorted(set(cfg.launcher.env) & set(cfg.launcher.secrets))
    if both:
        raise UserError(
            f"{both[0]} is both in launcher.secrets and launcher.env; secrets pass by name "
            "from your environment: remove it from launcher.env"
        )


def run_name(run_dir: str | Path) -> str:
    """A job/rendezvous id from the run directory's name (letters, digits, - and _ only)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(run_dir).name).strip("-")
    return name or "llmctl"


def tee(src: IO[bytes], log_path: str | Path, echo: TextIO | None) -> None:
    """Copy a child's output to a log file (appending) and, if given, to a console stream."""
    sink = getattr(echo, "buffer", None)
    with open(log_path, "ab") as log:
        for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
            log.write(chunk)
            log.flush()
            if sink is not None:
                sink.write(chunk)
                sink.flush()
            elif echo is not None:
                echo.write(chunk.decode(errors="replace"))
                echo.flush()
