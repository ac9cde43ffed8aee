"""Progress for logs (percentage and ETA from the input size, plain lines when stderr is not a
terminal) and chaining dedup -> preprocess (issue 12, finding 6)."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from llmctl.progress import ByteProgress

LINE = re.compile(
    r"^preprocess: (\d+\.\d)% ([\d,.]+)/([\d,.]+) MB ([\d,]+) docs [\d,.]+ MB/s(?: [\d,]+ tok/s)? "
    r"ETA (\d+:\d\d:\d\d|\?)$"
)


def test_plain_lines_carry_percentage_and_eta() -> None:
    out = io.StringIO()
    with ByteProgress("preprocess", stream=out, tty=False, interval_s=0) as p:
        p.update(total=4_000_000)
        for _ in range(4):
            p.update(num_bytes=1_000_000, docs=10, tokens=1000)
    lines = out.getvalue().splitlines()
    matches = [LINE.match(ln) for ln in lines]
    assert all(matches), lines
    pcts = [float(m.group(1)) for m in matches if m]
    assert pcts[:5] == [0.0, 25.0, 50.0, 75.0, 100.0] and pcts[-1] == 100.0
    assert matches[1] and matches[1].group(5) != "?"  # an ETA once there is a rate
    assert matches[-1] and matches[-1].group(5) == "0:00:00"


def test_cli_prints_progress_when_stderr_is_not_a_terminal(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    """As under nohup or in a SLURM log: stderr is a file, and progress lines still come."""
    cmd = [sys.executable, "-m", "llmctl", "data", "preprocess", str(corpus), "-o",
           str(tmp_path / "p"), "-t", str(hf_tokenizer), "-j", "1"]  # fmt: skip
    env = {**os.environ, "LLMCTL_PROGRESS_INTERVAL_S": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("preprocess: ")]
    assert len(lines) >= 2 and all(LINE.match(ln) for ln in lines), out.stderr
    assert lines[-1].startswith("preprocess: 100.0% ")


def test_preprocess_reads_a_dedup_folder_and_the_manifest_links_them(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    base = [sys.executable, "-m", "llmctl", "data"]
    dd = tmp_path / "dd"
    run = subprocess.run([*base, "dedup", str(corpus), "-o", str(dd), "-j", "1", "--json"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    kept = json.loads(run.stdout)["num_kept"]
    prefix = tmp_path / "ds"
    cmd = [*base, "preprocess", str(dd), "-o", str(prefix), "-t", str(hf_tokenizer), "-j", "1",
           "--json"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["num_docs"] == kept  # the report is not read as input
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    assert [Path(i["path"]).name for i in manifest["inputs"]] == [corpus.name]
    report = dd / "dedup_report.json"
    assert manifest["dedup"]["report"] == str(report.resolve())
    import hashlib

    assert manifest["dedup"]["report_sha256"] == hashlib.sha256(report.read_bytes()).hexdigest()
    assert manifest["command"]["argv"][1:] == cmd[3:]
    assert manifest["command"]["host"] == socket.gethostname()
    assert json.loads(report.read_text())["command"]["host"] == socket.gethostname()


def test_clean_dedup_preprocess_chain_in_every_manifest(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    """clean -> dedup -> preprocess: the dedup report names the clean run it read, and the
    dataset manifest names both (the report files and their SHA-256); clean -> preprocess
    directly names the clean run alone."""
    import hashlib

    base = [sys.executable, "-m", "llmctl", "data"]
    cl, dd = tmp_path / "clean", tmp_path / "dd"
    steps = [
        ["clean", str(corpus), "-o", str(cl), "--filters", "charset", "--pii", "-j", "1",
         "--set", "charset.max_digit_ratio=0.5"],
        ["dedup", str(cl), "-o", str(dd), "-j", "1"],
        ["preprocess", str(dd), "-o", str(tmp_path / "ds"), "-t", str(hf_tokenizer), "-j", "1"],
        ["preprocess", str(cl), "-o", str(tmp_path / "direct"), "-t", str(hf_tokenizer), "-j",
         "1"],
    ]  # fmt: skip
    for argv in steps:
        run = subprocess.run([*base, *argv], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
    clean_report = cl / "clean_report.json"
    digest = hashlib.sha256(clean_report.read_bytes()).hexdigest()
    dedup_report = json.loads((dd / "dedup_report.json").read_text())
    assert dedup_report["clean"]["report"] == str(clean_report.resolve())
    assert dedup_report["clean"]["report_sha256"] == digest
    assert dedup_report["clean"]["charset"]["max_digit_ratio"] == 0.5
    assert dedup_report["clean"]["steps"] == ["charset", "pii"]
    chained = json.loads((tmp_path / "ds.manifest.json").read_text())
    assert chained["clean"] == dedup_report["clean"]
    assert chained["dedup"]["report"] == str((dd / "dedup_report.json").resolve())
    direct = json.loads((tmp_path / "direct.manifest.json").read_text())
    assert direct["clean"]["report_sha256"] == digest and direct["dedup"] is None
