"""One launcher protocol: what `llmctl train` decided (`TrainLaunch`) and the interface every
launcher backend implements (`Backend`), with the registry from `launcher.kind` to backend.

A backend renders first (pure: the argv, environment or script that `--dry-run` prints), then
executes what it rendered; `status`, `logs` and `cancel` of a run directory go to the backend
its `launch.json` names. `launch.api` and `launch.jobs` only talk to this interface, so a new
backend is one new module with one class and one line in `BACKENDS` (plus its value in the
config schema's `LauncherKind`); no other backend changes. Backends are imported only when
their kind is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.launch.jobs import RunStatus
    from llmctl.launch.reentry import ResumePoint
    from llmctl.plan import Layout, PlanRecord
    from llmctl.run.data import DataSpec
    from llmctl.run.lock import RunLock

BACKENDS: dict[str, str] = {
    "local": "llmctl.launch.local:LocalBackend",
    "torchrun": "llmctl.launch.torchrun:TorchrunBackend",
    "slurm": "llmctl.launch.slurm:SlurmBackend",
    "kubernetes": "llmctl.launch.k8s:KubernetesBackend",
}
"""`launcher.kind` -> "module:class" of its backend (registration: one line per backend)."""


class Rendering(Protocol):
    """What a backend rendered: the exact commands or script it will run (pure data)."""

    def describe(self) -> dict[str, Any]:
        """Fields of the `--dry-run --json` view (e.g. `command` and `env`, `nodes`, `sbatch`)."""
        ...

    def sections(self) -> list[tuple[str, str]]:
        """`(title, text)` sections of the `--dry-run` text form, printed verbatim."""
        ...

    def recorded(self) -> dict[str, Any]:
        """Fields `launch.json` keeps about what was run."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainLaunch:
    """Everything `llmctl train` decided before running anything (built by `prepare_train`)."""

    cfg: RootConfig
    """The resolved configuration (what the run directory's config.yaml will hold)."""
    run_dir: Path
    layout: Layout
    plan: PlanRecord
    """The plan record (chosen layout and predictions) written to plan.json."""
    rendering: Rendering
    resume_point: ResumePoint | None = None
    """What an existing run directory's ranks will load; None for a new run directory."""
    data: DataSpec | None = None
    """The explicit data.prefixes, checked; None = the demo corpus, built at launch."""

    @property
    def kind(self) -> str:
        """`launcher.kind`: the backend that runs this launch."""
        return str(self.cfg.launcher.kind)

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: what would run (the --dry-run/--json view)."""
        from llmctl.run.layout import layout_record

        out: dict[str, Any] = {
            "kind": self.kind,
            "run_dir": str(self.run_dir),
            "layout": layout_record(self.layout, self.cfg.train.global_batch_size),
            "world_size": self.layout.world_size,
            "plan": self.plan.as_dict(),
        }
        if self.resume_point is not None:
            out["resume"] = self.resume_point.as_dict()
        out.update(self.rendering.describe())
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How `Backend.execute` ended: a run that ran here to its end, or a submitted job."""

    exit_code: int | None = None
    """The run's exit code (a rank's own when one reported it); None for a submitted job."""
    job_id: str | None = None
    """The scheduler's id of a submitted job (it runs on after `execute` returns)."""
    reason: str | None = None
    """The first failing rank's one-line reason, if one was reported."""


Started = Callable[[dict[str, Any]], None]
"""Called by `execute` once the run exists (before it runs, or once it is submitted), with
fields to add to launch.json (e.g. the job id); it writes the launch record."""


class Backend(Protocol):
    """A launcher: render, check, execute; then status, logs and cancel of its runs."""

    holds_lock: bool
    """The launcher holds the run-directory lock while the run lasts (else rank 0 takes it)."""
    port_spread: int
    """How far above `launcher.rdzv_port` the rendered rendezvous port may go (per-job offset)."""

    def configure(self, cfg: RootConfig) -> RootConfig:
        """The config with this backend's defaults filled in, before planning (pure)."""
        ...

    def render(self, cfg: RootConfig, run_dir: Path, layout: Layout) -> Rendering:
        """What will run (pure apart from reading files the config names, e.g. a hostfile)."""
        ...

    def check(self, launch: TrainLaunch) -> None:
        """Requirements checked before the run directory or any process exists."""
        ...

    def execute(
        self, launch: TrainLaunch, *, echo: TextIO | None, lock: RunLock | None, started: Started
    ) -> Outcome:
        """Run (or submit) what `render` gave; the one place the backend starts the run."""
        ...

    def status(self, run_dir: Path, record: dict[str, Any]) -> RunStatus:
        """Where a run launched by this backend stands (`record`: its launch.json)."""
        ...

    def log_path(self, run_dir: Path, record: dict[str, Any]) -> Path:
        """The file holding the run's console output."""
        ...

    def cancel(self, run_dir: Path, record: dict[str, Any]) -> None:
        """Stop the run (its ranks get SIGTERM: they checkpoint and exit)."""
        ...


def backend_for(kind: str) -> Backend:
    """The backend registered for `launcher.kind` (its module is imported now).

    Raises:
        UserError: No backend is registered under `kind`.
    """
    target = BACKENDS.get(str(kind))
    if target is None:
        raise UserError(f"unknown launcher.kind {str(kind)!r}: use {_choices()}")
    module, name = target.split(":")
    cls: Callable[[], Backend] = getattr(importlib.import_module(module), name)
    return cls()


def _choices() -> str:
    kinds = list(BACKENDS)
    return " or ".join(kinds) if len(kinds) < 3 else f"{', '.join(kinds[:-1])} or {kinds[-1]}"
