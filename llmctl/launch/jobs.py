"""Status and logs of a run: SLURM jobs through `scontrol show job` (no accounting needed),
local and ssh runs through the run directory's launch record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from llmctl.errors import UserError
from llmctl.launch.api import LAUNCH_FILE, read_launch
from llmctl.launch.slurm import JOB_ID_FILE

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
_FIELD_RE = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|$)")


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

    @property
    def finished(self) -> bool:
        """Whether the run can make no more progress."""
        return self.state in TERMINAL

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for --json."""
        return {**asdict(self), "finished": self.finished}


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value fields) as a dict (pure)."""
    return {m.group(1): m.group(2) for m in _FIELD_RE.finditer(text.strip())}


def _scontrol_job(job_id: str) -> dict[str, str]:
    """The one place this module runs a process: `scontrol show job -o JOBID`."""
    if shutil.which("scontrol") is None:
        raise UserError("scontrol not found on PATH: run this where the SLURM client tools are")
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {"JobState": "GONE"}
        raise UserError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
    return parse_scontrol(proc.stdout)


def _metrics(run_dir: Path) -> tuple[int | None, float | None]:
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


def _total_steps(run_dir: Path) -> int | None:
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
    import socket

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
        return _dir_status(path)
    if target.isdigit():
        job = _scontrol_job(target)
        workdir = job.get("WorkDir")
        run_dir = Path(workdir) if workdir and (Path(workdir) / "config.yaml").is_file() else None
        return _slurm_status(run_dir, target, job)
    raise UserError(f"{target} is neither a run directory nor a SLURM job id")


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
    launch = _launched(run_dir)
    if launch.get("kind") == "slurm":
        job_id = _job_id(run_dir, launch)
        status = _slurm_status(run_dir, job_id, _scontrol_job(job_id))
        if status.state == "GONE" and "exit_code" in launch:  # recorded by the batch script
            return replace(status, exit_code=f"{launch['exit_code']}:0")
        return status
    if "exit_code" in launch:
        state = "COMPLETED" if launch["exit_code"] == 0 else "FAILED"
    else:
        alive = _launcher_alive(launch) or trainer_alive(run_dir)
        state = "RUNNING" if alive else "EXITED"
    step, loss = _metrics(run_dir)
    return RunStatus(
        run_dir=str(run_dir),
        kind=str(launch.get("kind")),
        state=state,
        exit_code=None if "exit_code" not in launch else str(launch["exit_code"]),
        step=step,
        loss=loss,
        total_steps=_total_steps(run_dir),
    )


def _slurm_status(run_dir: Path | None, job_id: str, job: dict[str, str]) -> RunStatus:
    step, loss = _metrics(run_dir) if run_dir else (None, None)
    restarts = job.get("Restarts")
    return RunStatus(
        run_dir=str(run_dir) if run_dir else None,
        kind="slurm",
        job_id=job_id,
        state=job.get("JobState", "UNKNOWN"),
        reason=_slurm_value(job.get("Reason")),
        exit_code=job.get("ExitCode"),
        restarts=int(restarts) if restarts else None,
        nodes=_slurm_value(job.get("NodeList")),
        elapsed=job.get("RunTime"),
        step=step,
        loss=loss,
        total_steps=_total_steps(run_dir) if run_dir else None,
    )


def _job_id(run_dir: Path, launch: dict[str, Any]) -> str:
    """The SLURM job id of a run: launch.json, else the slurm_job_id file.

    Raises:
        UserError: Neither names one (asking scontrol for "" would list every job).
    """
    job_id = str(launch.get("job_id") or _read(run_dir / JOB_ID_FILE).strip())
    if not job_id:
        raise UserError(
            f"{run_dir}: no SLURM job id in {LAUNCH_FILE} or {JOB_ID_FILE}; "
            "pass the job id itself: `llmctl status JOBID`"
        )
    return job_id


def _slurm_value(value: str | None) -> str | None:
    """scontrol's spelling of "no value" (`Reason=None`, `NodeList=(null)`) as None."""
    return None if value in (None, "", "None", "(null)") else value


def log_path(run_dir: Path) -> Path:
    """The file holding a run's console output (SLURM output, or the launcher's tee)."""
    launch = read_launch(run_dir)
    if launch.get("kind") == "slurm":
        return run_dir / f"slurm-{_job_id(run_dir, launch)}.out"
    if launch.get("kind") == "torchrun":
        return run_dir / "logs" / "node0.log"
    return run_dir / "logs" / "launcher.log"


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
    _launched(rd)
    path, offset = log_path(rd), 0
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
