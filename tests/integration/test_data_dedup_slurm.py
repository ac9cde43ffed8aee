"""dedup --launcher slurm on the real local cluster equals dedup on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_support import cluster_up, wait_finished

from llmctl.data.dedup import DedupConfig, dedup
from llmctl.data.slurm import SlurmOptions, submit_dedup
from llmctl.data.synthetic import planted_corpus

pytestmark = pytest.mark.slurm


def test_array_dedup_matches_local(tmp_path: Path) -> None:
    if not cluster_up():
        pytest.skip("local SLURM cluster is not up (scripts/slurm_local.sh up)")
    planted = planted_corpus(num_bases=150, num_plain=100, seed=3)
    half = len(planted.texts) // 2
    inputs = []
    for k, texts in enumerate((planted.texts[:half], planted.texts[half:])):
        path = tmp_path / "in" / f"part{k}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        inputs.append(str(path))
    cfg = DedupConfig(inputs=inputs, output_dir=str(tmp_path / "slurm_out"))
    job = submit_dedup(cfg, SlurmOptions(time_limit="00:05:00"))
    assert job["num_tasks"] == 2
    assert wait_finished(job["final_job"], timeout_s=180) in ("COMPLETED", "UNKNOWN")
    report = json.loads((tmp_path / "slurm_out" / "dedup_report.json").read_text())
    local = dedup(DedupConfig(inputs=inputs, output_dir=str(tmp_path / "local_out"), num_workers=1))
    assert report["num_kept"] == local.num_kept < len(planted.texts)
    for name in ("part0.jsonl", "part1.jsonl"):
        slurm_kept = (tmp_path / "slurm_out" / name).read_bytes()
        assert slurm_kept == (tmp_path / "local_out" / name).read_bytes()
    logs = sorted(p.name for p in (tmp_path / "slurm_out.llmctl-tmp").glob("slurm-*.out"))
    assert len(logs) == 3  # two array tasks and the clustering job
