"""SIGTERM and Ctrl-C stop `llmctl data preprocess` and its pool workers promptly, with one
line saying what was kept; a rerun resumes from it (issue 12, finding 5). Real processes and
real signals: the console script is started as a user starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmctl.data.corpus import stdlib_sources
from llmctl.data.tokenizer import train_bpe

pytestmark = pytest.mark.slow


def _inputs(root: Path) -> tuple[Path, Path]:
    """A folder of text files: one small (its chunk finishes first) and two of ~3 MB (one
    document each, several seconds of tokenizing), and a small tokenizer."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for _, p in stdlib_sources()[:300]]
    blob = "\n".join(texts)
    folder = root / "docs"
    folder.mkdir()
    (folder / "a_small.txt").write_text(blob[:1_200_000])
    for name in ("b_big.txt", "c_big.txt"):
        (folder / name).write_text((blob * (3_000_000 // len(blob) + 1))[:3_000_000])
    tok = train_bpe(texts[:50], root / "tok", vocab_size=512)
    return folder, tok


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text().split()
        found.extend(int(c) for c in text)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_workers_and_keeps_finished_chunks(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    folder, tok = _inputs(tmp_path)
    prefix = tmp_path / "ds"
    work = tmp_path / "ds.llmctl-tmp"
    cmd = [sys.executable, "-m", "llmctl", "data", "preprocess", str(folder), "-o", str(prefix),
           "-t", str(tok), "-j", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while not list(work.glob("shard_*.done.json")):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no chunk finished in time"
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert workers, "no pool workers seen"
    # SIGTERM goes to the main process (as `kill PID` or SLURM's); Ctrl-C to the whole
    # foreground process group, as a terminal sends it.
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "chunks done and kept in" in lines[0] and "run the same command again" in lines[0]
    deadline = time.monotonic() + 10  # the big chunks need far longer than this to finish
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "pool workers still running after the signal"
    kept = len(list(work.glob("shard_*.done.json")))
    assert kept < 3 and not prefix.with_suffix(".bin").exists()
    assert f"{kept} of 3 chunks done" in lines[0]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert f'"num_chunks_resumed": {kept}' in out.stdout
