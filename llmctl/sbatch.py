"""Submitting a batch script to SLURM: the one place llmctl runs `sbatch`.

Training jobs (`llmctl.launch.slurm`) and data jobs (`llmctl.data.slurm`) both submit through
`submit`; it sits at the bottom of the package graph (stdlib and `errors` only), so `data/`
uses it without importing `launch/`. Rendering the scripts stays with each caller.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from llmctl.errors import UserError


class SbatchFailed(UserError):
    """sbatch exited non-zero; its output is kept for the caller's own wording."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"sbatch failed: {stderr.strip() or stdout.strip()}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def last_line(self) -> str:
        """sbatch's last line on stderr (its reason), else `exit code N`."""
        return (self.stderr.strip().splitlines() or [f"exit code {self.returncode}"])[-1]


def submit(args: Sequence[str], *, cwd: str | Path | None = None) -> str:
    """Run `sbatch --parsable ARGS` (options, then the script) and return the job id.

    Args:
        args: sbatch options followed by the script path.
        cwd: Directory sbatch runs in (the job's default working directory); None = this one.

    Returns:
        The job id (`--parsable` prints `ID` or `ID;CLUSTER`).

    Raises:
        UserError: sbatch is not installed here.
        SbatchFailed: sbatch refused the job (a `UserError` naming sbatch's message).
    """
    try:
        proc = subprocess.run(
            ["sbatch", "--parsable", *args], cwd=cwd, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise UserError("sbatch not found: is SLURM installed on this machine?") from None
    if proc.returncode != 0:
        raise SbatchFailed(proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout.strip().split(";", 1)[0]
