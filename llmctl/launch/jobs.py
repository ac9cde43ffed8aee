"""Status, logs and cancel of a run: through the backend its launch record names.

A run directory's `launch.json` names the launcher kind; `launch.backend.backend_for` gives the
backend that answers (SLURM: `scontrol show job`, no accounting needed; local and ssh: the
launch record and the processes of this host). A bare number is a SLURM job id.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError
from llmctl.launch.api import LAUNCH_FILE, read_launch
from llmctl.launch.backend import BACKENDS, backend_for

if TYPE_CHECKING:
    from llmctl.launch.backend import Backend

TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "GONE",
        "EXITED",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStatus:
    """Where a run stands."""

    run_dir: str | None
    kind: str
    state: str
    job_id: str | None = None
    reason: str | None = None
    exit_code: str | None = None
    restarts: int | None = None
    nodes: str | None = None
    elapsed: str | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    storage: dict[str, Any] | None = None  # checkpoint backend, newest committed, upload
    layout: dict[str, Any] | None = None  # current and original layout, elastic changes

    @property
    def finished(self) -> bool:
        """Whether the run can make no more progress."""
        return self.state in TERMINAL

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for --json."""
        return {**asdict(self), "finished": self.finished}


def last_metrics(run_dir: Path) -> tuple[int | None, float | None]:
    """(step, loss) of the last complete record of RUN_DIR/metrics.jsonl; Nones if none."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None, None
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        return rec.get("step"), rec.get("loss")
    return None, None


def total_steps(run_dir: Path) -> int | None:
    """`train.train_iters` of the run's config.yaml (read as text: no config validation)."""
    match = re.search(r"^\s*train_iters:\s*(\d+)", _read(run_dir / "config.yaml"), re.M)
    return int(match.group(1)) if match else None


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _launcher_alive(launch: dict[str, Any]) -> bool:
    """Whether the launcher recorded in launch.json still runs: its pid is alive on this host
    and that process started before the record (a launcher killed with -9 records no exit code,
    and its pid is later reused by other processes)."""
    pid = launch.get("pid")
    if launch.get("host", socket.gethostname()) != socket.gethostname() or not pid:
        return False
    if not _pid_alive(int(pid)):
        return False
    started = _process_start(int(pid))
    recorded = launch.get("started")
    return started is None or recorded is None or started <= float(recorded) + 2.0


def _process_start(pid: int) -> float | None:
    """Start time (Unix seconds, ~1 s precision) of a live process, from /proc; None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, clock ticks
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def trainer_alive(run_dir: Path) -> bool:
    """Whether training processes still hold the run directory (ranks outliving a launcher)."""
    from llmctl.run.lock import check_run_lock

    try:
        check_run_lock(run_dir)
    except UserError:
        return True
    return False


def run_status(target: str) -> RunStatus:
    """Status of a run directory or a SLURM job id.

    Raises:
        UserError: The target is neither, or SLURM cannot be queried.
    """
    path = Path(target)
    if path.is_dir():
        from llmctl.run.ckpt_upload import storage_status

        status = _dir_status(path)
        return replace(status, storage=storage_status(path), layout=layout_status(path))
    if target.isdigit():
        from llmctl.launch.slurm import job_status

        return job_status(target)
    raise UserError(f"{target} is neither a run directory nor a SLURM job id")


def layout_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's layout now and when it started (`Layout.short()`), from launch.json's elastic
    `layout_changes` or, with none, plan.json; None when neither says."""
    from llmctl.run.layout import layout_from_record

    try:
        changes = list(read_launch(run_dir).get("layout_changes") or [])
    except (OSError, ValueError):
        changes = []
    if changes:
        current = layout_from_record(changes[-1]["new_layout"]).short()
        original = layout_from_record(changes[0]["old_layout"]).short()
        last = {k: changes[-1].get(k) for k in ("reason", "time", "from_step", "seconds_lost")}
        return {"current": current, "original": original, "changes": len(changes),
                "last_change": last}  # fmt: skip
    try:
        planned = json.loads((run_dir / "plan.json").read_text()).get("layout_name")
    except (OSError, ValueError):
        return None
    if not planned:
        return None
    return {"current": planned, "original": planned, "changes": 0, "last_change": None}


def cancel_run(run_dir: str | Path) -> None:
    """Stop a run through its backend (its ranks get SIGTERM: they checkpoint and exit).

    Raises:
        UserError: Not a run directory started by `llmctl train`, or the backend cannot stop
            it from here (e.g. its launcher runs on another host).
    """
    rd = Path(run_dir)
    record = _launched(rd)
    _backend(record).cancel(rd, record)


def _backend(record: dict[str, Any]) -> Backend:
    """The backend of a launch record; a kind no backend is registered for reads as a run
    whose launcher waits on it here (local)."""
    kind = str(record.get("kind"))
    return backend_for(kind if kind in BACKENDS else "local")


def _launched(run_dir: Path) -> dict[str, Any]:
    """launch.json of a run directory; one wording for each way it can be missing."""
    from llmctl.run.rundir import require_run_dir

    require_run_dir(run_dir)
    try:
        launch = read_launch(run_dir)
    except ValueError as e:  # cut short (full disk, crash) or edited: not JSON
        raise UserError(
            f"{run_dir / LAUNCH_FILE} is not valid JSON ({e}); it is the launcher's record of "
            f"the run: restore it, or launch the run again with `llmctl resume {run_dir}`"
        ) from None
    if not launch:
        raise UserError(
            f"{run_dir} was never launched (no {LAUNCH_FILE}); start it with `llmctl train`"
        )
    return launch


def _dir_status(run_dir: Path) -> RunStatus:
    record = _launched(run_dir)
    return _backend(record).status(run_dir, record)


def status_from_record(run_dir: Path, record: dict[str, Any]) -> RunStatus:
    """Status of a run whose launcher waits on it (local, ssh): finished when launch.json has
    its exit code, else running while the launcher or any of its ranks lives."""
    if "exit_code" in record:
        state = "COMPLETED" if record["exit_code"] == 0 else "FAILED"
    else:
        alive = _launcher_alive(record) or trainer_alive(run_dir)
        state = "RUNNING" if alive else "EXITED"
    step, loss = last_metrics(run_dir)
    return RunStatus(
        run_dir=str(run_dir),
        kind=str(record.get("kind")),
        state=state,
        exit_code=None if "exit_code" not in record else str(record["exit_code"]),
        step=step,
        loss=loss,
        total_steps=total_steps(run_dir),
    )


def signal_launcher(run_dir: Path, record: dict[str, Any], signum: int = signal.SIGTERM) -> None:
    """Send `signum` to the launcher of a run that waits on it here (local, ssh).

    The launcher passes SIGTERM on (local: to torchrun; ssh: its sessions end and every node
    stops its torchrun), so the ranks checkpoint and exit. A finished run is left as it is.

    Raises:
        UserError: The launcher does not run on this host (or no longer runs).
    """
    if "exit_code" in record:
        return
    if not _launcher_alive(record):
        where = f"pid {record.get('pid')} on {record.get('host', '?')}"
        raise UserError(
            f"{run_dir}: its launcher ({where}) is not running on this host; stop it where it runs"
        )
    os.kill(int(record["pid"]), signum)


def follow_logs(
    run_dir: str | Path,
    write: Callable[[str], None],
    *,
    follow: bool = False,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> RunStatus | None:
    """Write a run's log through `write`; with `follow`, keep going until the run finishes.

    Returns:
        The final status when following, else None.

    Raises:
        UserError: Not a run directory started by `llmctl train`.
    """
    rd = Path(run_dir)
    record = _launched(rd)
    path, offset = _backend(record).log_path(rd, record), 0  # SLURM output, or the launcher's
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        offset = _drain(path, offset, write)
        if not follow:
            return None
        status = _dir_status(rd)
        if status.finished:
            _drain(path, offset, write)
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


def _drain(path: Path, offset: int, write: Callable[[str], None]) -> int:
    if not path.is_file():
        return offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    if data:
        write(data.decode(errors="replace"))
    return offset + len(data)
