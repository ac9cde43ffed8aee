"""Every example in README.md's "Examples" block, run in order, as a user would type it.

The block is read from README.md when the test runs (so renamed flags are caught the moment the
README and the CLI disagree) and each line runs through bash in one fresh directory, with the
`llmctl` of this interpreter first on PATH. The inputs are the README's own: the corpus comes
from `llmctl data corpus`, the tokenizer from `llmctl data tokenizer train`, and so on. Two
kinds of line get `--dry-run` appended, because what they would start is not here: training on
SLURM (submitting would queue a job that outlives the test) and torchrun over ssh to the
README's example hosts. Plan lines on GPU recipes run as they are (`plan` is pure). A line
fails the test when it exits non-zero; the message names the line and shows its stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The whole chain is one test: ~140 s of CPU on the 2-core host (824 s of wall time at load
# ~25), so the suite-wide 600 s limit would cut it short on a slow or loaded host; each line
# keeps its own 600 s limit against a hang. multiproc: `llmctl train` starts torchrun.
pytestmark = [pytest.mark.slow, pytest.mark.multiproc, pytest.mark.timeout(1800)]

README = Path(__file__).resolve().parents[2] / "README.md"
DRY_RUN_ONLY = ("launcher=slurm", "launcher=torchrun")


def readme_examples(text: str) -> list[str]:
    """Command lines of the first ```bash block after the "## Examples" heading."""
    section = text.split("## Examples", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no ```bash block under ## Examples"
    joined = block.group(1).replace("\\\n", " ")  # backslash continuations
    return [line for line in joined.splitlines() if line.strip() and line[0] != "#"]


def _as_run(line: str) -> str:
    launches = line.startswith("llmctl train") and any(k in line for k in DRY_RUN_ONLY)
    if launches and "--dry-run" not in line:
        return line.split("#", 1)[0].rstrip() + " --dry-run"
    return line


def test_readme_examples_run_in_order(tmp_path: Path) -> None:
    lines = readme_examples(README.read_text())
    assert len(lines) >= 20 and sum(x.startswith("llmctl ") for x in lines) >= 20
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "llmctl").is_file(), "llmctl is not installed next to this python"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "100",
    }
    env.pop("LLMCTL_VERBOSE", None)
    outputs = {}
    for line in lines:
        cmd = _as_run(line)
        proc = subprocess.run(
            ["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, (
            f"README example failed (rc {proc.returncode}): {cmd}\n"
            f"stderr: {proc.stderr[-2000:]}\nstdout: {proc.stdout[-1000:]}"
        )
        outputs[cmd] = proc.stdout + proc.stderr
    # library warnings of the ranks are in their log file, not in what `llmctl logs` prints
    (logs,) = [out for cmd, out in outputs.items() if cmd.startswith("llmctl logs")]
    assert "full scope is deprecated" not in logs and "Warning" not in logs, logs
    assert "full scope is deprecated" in (tmp_path / "runs/demo/logs/rank0.log").read_text()
    # what the chain produced, read back by its consumers' own formats
    assert (tmp_path / "runs/demo/checkpoints").is_dir()
    for out in ("hf", "w4a16", "fp8", "w8a16"):
        assert (tmp_path / out / "config.json").is_file(), out
    import json

    w8 = json.loads((tmp_path / "w8a16/quant_report.json").read_text())
    assert w8["group_size"] == 64 and w8["perplexity_before"] is not None
