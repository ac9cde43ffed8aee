"""clean --launcher slurm on the real local cluster equals clean on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_support import cluster_up, wait_finished

from llmctl.data.clean import clean
from llmctl.data.clean_config import CleanConfig, Step
from llmctl.data.clean_corpus import build_corpus
from llmctl.data.clean_slurm import submit_clean
from llmctl.data.slurm import SlurmOptions

pytestmark = pytest.mark.slurm


def _inputs(tmp_path: Path) -> list[str]:
    texts = [d.text for d in build_corpus(max_docs=300, seed=5)]
    paths = []
    for k, part in enumerate((texts[:150], texts[150:])):
        path = tmp_path / "in" / f"part{k}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
        paths.append(str(path))
    return paths


def _cfg(inputs: list[str], out: Path) -> CleanConfig:
    steps = [Step.GOPHER_REPETITION, Step.GOPHER_QUALITY, Step.C4, Step.FINEWEB, Step.PII]
    cfg = CleanConfig(inputs=inputs, output_dir=str(out), steps=steps, num_workers=1)
    cfg.gopher_quality.min_doc_words = 20  # a setting the job must carry to the nodes
    cfg.write_rejected = True
    return cfg


def test_array_clean_matches_local(tmp_path: Path) -> None:
    if not cluster_up():
        pytest.skip("local SLURM cluster is not up (scripts/slurm_local.sh up)")
    inputs = _inputs(tmp_path)
    job = submit_clean(_cfg(inputs, tmp_path / "slurm_out"), SlurmOptions(time_limit="00:05:00"))
    assert job["num_tasks"] == 2
    assert wait_finished(job["final_job"], timeout_s=240) in ("COMPLETED", "UNKNOWN")
    slurm = json.loads((tmp_path / "slurm_out" / "clean_report.json").read_text())
    local = clean(_cfg(inputs, tmp_path / "local_out"))
    assert 0 < slurm["num_kept"] == local["num_kept"] < slurm["num_docs"] == 300
    assert slurm["steps"] == local["steps"] and slurm["params"] == local["params"]
    assert slurm["params"]["gopher_quality"]["min_doc_words"] == 20
    for name in ("part0.jsonl", "part1.jsonl", "rejected.jsonl"):
        got = (tmp_path / "slurm_out" / name).read_bytes()
        assert got == (tmp_path / "local_out" / name).read_bytes(), name
    job_dir = tmp_path / "slurm_out.llmctl-tmp"
    logs = sorted(p.name for p in job_dir.glob("slurm-*.out"))
    assert len(logs) == 3  # two array tasks and the join job
    assert not list(job_dir.glob("part_*")) and not list(job_dir.glob("done_*"))


def test_print_script_writes_nothing_and_bad_input_is_one_line(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    base = [sys.executable, "-m", "llmctl", "data", "clean", *inputs, "-o",
            str(tmp_path / "out"), "--launcher", "slurm"]  # fmt: skip
    run = subprocess.run([*base, "--print-script"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "#SBATCH --array=0-1" in run.stdout and "clean-join" in run.stdout
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.llmctl-tmp").exists()
    bad = tmp_path / "in" / "part0.jsonl"
    bad.write_text("{not json\n" + bad.read_text())
    run = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "part0.jsonl:1" in run.stderr
    assert not (tmp_path / "out.llmctl-tmp").exists()
