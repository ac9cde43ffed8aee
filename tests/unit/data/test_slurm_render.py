"""The SLURM dedup scripts (pure rendering) are pinned by golden files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llmctl.data.slurm import (
    ARRAY_SCRIPT,
    FINAL_SCRIPT,
    PRE_ARRAY_SCRIPT,
    PRE_FINAL_SCRIPT,
    SlurmOptions,
    render_dedup_scripts,
    render_preprocess_scripts,
)

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "data"


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("default", SlurmOptions()),
        ("throttled", SlurmOptions(partition="cpu", cpus_per_task=2, max_parallel=4)),
    ],
)
def test_scripts_match_golden(name: str, opts: SlurmOptions) -> None:
    scripts = render_dedup_scripts(Path("/shared/out.llmctl-tmp"), 8, opts, "/opt/venv/bin/python")
    assert set(scripts) == {ARRAY_SCRIPT, FINAL_SCRIPT}
    text = "".join(f"# --- {k}\n{v}" for k, v in sorted(scripts.items()))
    path = GOLDEN / f"dedup_{name}.sbatch"
    if os.environ.get("LLMCTL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"missing golden file {path}: run with LLMCTL_UPDATE_GOLDEN=1"
    assert text == path.read_text()
    assert "#SBATCH --array=0-7" in scripts[ARRAY_SCRIPT]


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("default", SlurmOptions()),
        ("throttled", SlurmOptions(partition="cpu", cpus_per_task=2, max_parallel=4)),
    ],
)
def test_preprocess_scripts_match_golden(name: str, opts: SlurmOptions) -> None:
    scripts = render_preprocess_scripts(
        Path("/shared/ds.llmctl-tmp"), 5, opts, "/opt/venv/bin/python"
    )
    assert set(scripts) == {PRE_ARRAY_SCRIPT, PRE_FINAL_SCRIPT}
    text = "".join(f"# --- {k}\n{v}" for k, v in sorted(scripts.items()))
    path = GOLDEN / f"preprocess_{name}.sbatch"
    if os.environ.get("LLMCTL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"missing golden file {path}: run with LLMCTL_UPDATE_GOLDEN=1"
    assert text == path.read_text()
    assert "#SBATCH --array=0-4" in scripts[PRE_ARRAY_SCRIPT]
    assert "preprocess-merge /shared/ds.llmctl-tmp/job.json" in scripts[PRE_FINAL_SCRIPT]
    for text in scripts.values():  # valid bash, as sbatch will run it
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
