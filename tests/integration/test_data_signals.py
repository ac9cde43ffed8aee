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

import numpy as np
import pytest

from llmctl.data.corpus import stdlib_sources
from llmctl.data.tokenizer import train_bpe

pytestmark = pytest.mark.slow


NUM_FILES = 48


def _made_up_words(seed: int, size: int) -> str:
    """`size` characters of random lowercase words of 3-12 letters, different for each seed."""
    rng = np.random.default_rng(seed)
    text = rng.integers(ord("a"), ord("z") + 1, size, dtype=np.uint8)
    spaces = np.cumsum(rng.integers(4, 14, size // 4))
    text[spaces[spaces < size]] = ord(" ")
    return text.tobytes().decode("ascii")


def _inputs(root: Path) -> tuple[Path, Path]:
    """A folder of 48 text files of 1.1 MB (one document and one chunk each) of made-up words,
    and a small tokenizer.

    Every file has its own words, so a worker's word cache never helps: repeated source code
    tokenized at 50 MB/s (three such files finished within 30 ms of each other, before the
    signal), and 48 windows of one shared word list dropped from ~25 ms to ~7 ms of CPU per
    chunk once a worker had seen the first (measured). Unique words cost ~25 ms of CPU per
    chunk on the 2-core CI host, so two workers need ~0.6 s for all 48 (still ~0.2 s on a host
    3x faster), and a signal sent within ~10 ms of the first finished chunk finds most of them
    still to do."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for _, p in stdlib_sources()[:50]]
    folder = root / "docs"
    folder.mkdir()
    for i in range(NUM_FILES):
        (folder / f"doc_{i:02d}.txt").write_text(_made_up_words(i, 1_100_000))
    tok = train_bpe(texts, root / "tok", vocab_size=512)
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


def _as_from_a_terminal() -> None:
    """In the child before exec: Ctrl-C at its default, as in a terminal's foreground job. A
    suite started in the background of a non-interactive shell (`make test &`, nohup) inherits
    SIGINT ignored, and Python then keeps it ignored: the run finished with exit code 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_workers_and_keeps_finished_chunks(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    folder, tok = _inputs(tmp_path)
    prefix = tmp_path / "ds"
    work = tmp_path / "ds.llmctl-tmp"
    cmd = [sys.executable, "-m", "llmctl", "data", "preprocess", str(folder), "-o", str(prefix),
           "-t", str(tok), "-j", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)  # fmt: skip
    deadline = time.monotonic() + 240
    while not list(work.glob("shard_*.done.json")):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no chunk finished in time"
        time.sleep(0.005)
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
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers), "pool workers still running after the signal"
    kept = len(list(work.glob("shard_*.done.json")))
    assert 1 <= kept < NUM_FILES and not prefix.with_suffix(".bin").exists()
    assert f"{kept} of {NUM_FILES} chunks done" in lines[0]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert f'"num_chunks_resumed": {kept}' in out.stdout
