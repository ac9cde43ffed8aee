"""preprocess --launcher slurm on the real local cluster: an array job over input chunks and a
dependent merge job give bytes identical to a run on this machine (issue 12, item 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_support import cluster_up, wait_finished

from llmctl.data.corpus import build_demo_corpus
from llmctl.data.preprocess import PreprocessConfig, preprocess
from llmctl.data.tokenizer import train_bpe

pytestmark = pytest.mark.slurm


def test_array_preprocess_matches_local(tmp_path: Path) -> None:
    if not cluster_up():
        pytest.skip("local SLURM cluster is not up (scripts/slurm_local.sh up)")
    corpus = tmp_path / "in" / "corpus.jsonl"
    build_demo_corpus(corpus, max_docs=120)
    texts = [json.loads(ln)["text"] for ln in corpus.read_text().splitlines()]
    second = tmp_path / "in" / "more.jsonl"  # a second input file, with an empty document
    second.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", *texts[:30]]))
    tok = train_bpe(texts, tmp_path / "tok", vocab_size=600)
    prefix = tmp_path / "slurm_ds"
    cmd = [sys.executable, "-m", "llmctl", "data", "preprocess", str(tmp_path / "in"),
           "-o", str(prefix), "-t", str(tok), "--launcher", "slurm", "--max-parallel", "2",
           "--json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["num_tasks"] >= 2 and job["array_job"] and job["final_job"]
    state = wait_finished(job["final_job"], timeout_s=300)
    logs = "\n".join(p.read_text() for p in Path(job["job_dir"]).glob("slurm-*.out"))
    assert state in ("COMPLETED", "UNKNOWN"), logs
    local = tmp_path / "local_ds"
    cfg = PreprocessConfig(inputs=[str(tmp_path / "in")], output_prefix=str(local),
                           tokenizer=str(tok), num_workers=1)  # fmt: skip
    summary = preprocess(cfg)
    for suffix in (".bin", ".idx"):
        assert Path(f"{prefix}{suffix}").read_bytes() == Path(f"{local}{suffix}").read_bytes()
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    assert manifest["counts"]["documents"] == summary.num_docs == len(texts) + 31
    assert manifest["counts"]["empty_documents"] == 1
    assert manifest["command"]["argv"][1:] == cmd[3:]  # the submitter's command line
    assert manifest["command"]["slurm_job"]  # merged by a SLURM job
    names = sorted(p.name for p in Path(job["job_dir"]).iterdir())
    assert "job.json" in names and not [n for n in names if n.startswith("shard_")]
    assert len([n for n in names if n.startswith("slurm-")]) == job["num_tasks"] + 1
