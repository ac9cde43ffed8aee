"""Pieces every launcher renders the same way: process shape, torchrun prefix, environment.

Pure functions of the configuration and the layout; nothing here starts a process.
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan import Layout

ENTRY_MODULE = "llmctl.train.entry"
NODE_MODULE = "llmctl.launch.node"
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


def check_launcher_values(cfg: RootConfig, *, port_spread: int = 0) -> None:
    """Refuse launcher numbers no launch can use, before planning reads them.

    Args:
        cfg: The resolved configuration.
        port_spread: How far the backend may raise `launcher.rdzv_port` (`Backend.port_spread`:
            SLURM adds a per-job offset).

    Raises:
        UserError: `launcher.nproc_per_node` below 1, `launcher.max_restarts` below 0, or
            `launcher.rdzv_port` outside 1..65535 (with the backend's offset added).
    """
    from llmctl.launch.elastic import check_elastic

    lc = cfg.launcher
    check_elastic(cfg)
    if lc.nproc_per_node is not None and lc.nproc_per_node < 1:
        raise UserError(
            "launcher.nproc_per_node must be >= 1 or null (from the layout), "
            f"got {lc.nproc_per_node}"
        )
    if lc.max_restarts < 0:
        raise UserError(f"launcher.max_restarts must be >= 0, got {lc.max_restarts}")
    spread = port_spread
    if not 1 <= lc.rdzv_port <= 65535 - spread:
        raise UserError(
            f"launcher.rdzv_port must be a TCP port in 1..{65535 - spread}, got {lc.rdzv_port}"
            + (f" (launcher={lc.kind} adds up to {spread} per job)" if spread else "")
        )


def layout_of(cfg: RootConfig, layout: Layout | None) -> Layout:
    """The given layout, or the one the configuration alone implies (DP defaults to 1)."""
    if layout is not None:
        return layout
    from llmctl.run.layout import resolve_layout

    return resolve_layout(cfg)


def launch_shape(cfg: RootConfig, layout: Layout, num_nodes: int) -> Shape:
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


def python_of(cfg: RootConfig) -> str:
    """The interpreter that runs torchrun: `launcher.python`, else this one."""
    return str(cfg.launcher.python or sys.executable)


def torchrun_prefix(python: str) -> list[str]:
    """`torchrun` called through a known interpreter (a bare `torchrun` may not be on PATH)."""
    return [python, "-m", "torch.distributed.run"]


def node_prefix(python: str, *, watch_stdin: bool = False) -> list[str]:
    """The per-node wrapper around torchrun under srun/ssh (`launch.node`): it exits with the
    rank's own code and ends the run's leftovers on its host."""
    return [python, "-m", NODE_MODULE, "run", *(["--watch-stdin"] if watch_stdin else []), "--"]


def entry_args(run_dir: str | Path) -> list[str]:
    """The training entry point and its one argument, the run directory."""
    return ["-m", ENTRY_MODULE, str(run_dir)]


def launch_env(cfg: RootConfig, shape: Shape) -> dict[str, str]:
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


def check_env_names(cfg: RootConfig) -> None:
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


# The line a rank prints when it exits non-zero (llmctl.train.entry); torchrun exits 1 whatever
# its workers' codes, so launchers read the rank's code from its output.
EXIT_LINE_RE = re.compile(rb"^llmctl: rank (\d+) exits (\d+): (.*)$", re.M)


class RankExits:
    """Exit codes ranks reported in their output (`EXIT_LINE_RE`), first report first."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, int, str]] = []
        self._partial: dict[int, bytes] = {}
        self._mutex = threading.Lock()

    def feed(self, chunk: bytes, source: int = 0) -> None:
        """Scan a chunk of one output stream (`source`: lines may span chunks)."""
        with self._mutex:
            data = self._partial.get(source, b"") + chunk
            cut = data.rfind(b"\n") + 1
            self._partial[source] = data[cut:][-4096:]
            for m in EXIT_LINE_RE.finditer(data[:cut]):
                message = m.group(3).decode(errors="replace").strip()
                self.reports.append((int(m.group(1)), int(m.group(2)), message))

    def exit_code(self, launcher_rc: int) -> int:
        """The code to give the user: a failed launcher's rank code when one was reported."""
        if launcher_rc == 0 or not self.reports:
            return launcher_rc
        return next((code for _, code, _ in self.reports if code), launcher_rc)

    def reason(self) -> str | None:
        """The first non-zero rank's one-line reason, if any."""
        return next((msg for _, code, msg in self.reports if code and msg), None)


def tee(
    src: IO[bytes],
    log_path: str | Path | None,
    echo: TextIO | None,
    exits: RankExits | None = None,
) -> None:
    """Copy a child's output to a log file (appending; None: no file) and to a console stream.

    Never raises on the log file: a full disk or an I/O error stops the copy to the file (one
    note on the console) while the console copy and the run go on, so the run's own failed-save
    policy decides what happens. Reads until every writer of `src` has closed it.
    """
    sink = getattr(echo, "buffer", None)
    log = None if log_path is None else _open_log(log_path, echo)
    for chunk in iter(lambda: src.read1(65536), b""):  # type: ignore[attr-defined]
        if exits is not None:
            exits.feed(chunk, id(src))
        if log is not None and log_path is not None:
            log = _log_write(log, chunk, log_path, echo)
        try:
            if sink is not None:
                sink.write(chunk)
                sink.flush()
            elif echo is not None:
                echo.write(chunk.decode(errors="replace"))
                echo.flush()
        except (OSError, ValueError):  # the console went away: keep draining the pipe
            sink = echo = None
    if log is not None:
        with contextlib.suppress(OSError):
            log.close()


def _open_log(log_path: str | Path, echo: TextIO | None) -> IO[bytes] | None:
    try:
        return open(log_path, "ab")  # closed by tee
    except OSError as e:
        _note(echo, f"llmctl: cannot write {log_path} ({e.strerror}); console output only")
        return None


def _log_write(
    log: IO[bytes], chunk: bytes, log_path: str | Path, echo: TextIO | None
) -> IO[bytes] | None:
    try:
        log.write(chunk)
        log.flush()
        return log
    except OSError as e:
        with contextlib.suppress(OSError):
            log.close()
        _note(echo, f"llmctl: stopped copying output to {log_path} ({e.strerror}); console only")
        return None


def _note(echo: TextIO | None, text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(text, file=echo if echo is not None else sys.stderr, flush=True)
