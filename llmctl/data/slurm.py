"""`llmctl data dedup --launcher slurm`: signatures as an array job, clustering after it.

Render, then execute. `render_dedup_scripts` is pure: from a job folder and the number of
chunks it returns two sbatch scripts, an array job whose task i computes the signatures and
LSH band keys of input chunk i (`signature_shard`), and a final job that clusters, reports and
writes the kept documents (`dedup.finish`). `execute_dedup_scripts` is the one function that
calls sbatch: the final job depends on the array (`--dependency=afterok:<array id>`), so it
runs only when every shard succeeded. A failed array task can be resubmitted alone; finished
shards are kept (their `.done.json` markers) and skipped.

The job folder (beside the output folder, `<output>.llmctl-tmp/`) holds `job.json` (the
options and the chunk plan), the scripts, the shards and the SLURM logs; it must be on a file
system every node sees, and every node must run the same Python (`sys.executable`).
Run as a module, this file is what the scripts call: `python -m llmctl.data.slurm
signatures|finish JOB_JSON [TASK_ID]`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmctl.data.dedup import (
    DedupConfig,
    DedupMode,
    Verify,
    finish,
    plan,
    prepare_work_dir,
    signature_shard,
)
from llmctl.data.manifest import read_json, write_json_atomic
from llmctl.data.minhash import ShingleUnit
from llmctl.data.readers import Chunk, FileScan, InputKind, OnError
from llmctl.errors import UserError

ARRAY_SCRIPT = "dedup_signatures.sbatch"
FINAL_SCRIPT = "dedup_cluster.sbatch"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmOptions:
    """How the dedup jobs ask SLURM for resources."""

    partition: str | None = None
    cpus_per_task: int = 1
    time_limit: str = "01:00:00"
    max_parallel: int | None = None


def _header(name: str, job_dir: Path, opts: SlurmOptions, log: str) -> list[str]:
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --output={shlex.quote(str(job_dir / log))}",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={opts.cpus_per_task}",
        f"#SBATCH --time={opts.time_limit}",
    ]
    if opts.partition:
        lines.append(f"#SBATCH --partition={shlex.quote(opts.partition)}")
    return lines


def render_dedup_scripts(
    job_dir: Path, num_chunks: int, opts: SlurmOptions, python: str
) -> dict[str, str]:
    """The two sbatch scripts (pure): {file name: text}."""
    job_json = shlex.quote(str(job_dir / "job.json"))
    py = shlex.quote(python)
    throttle = f"%{opts.max_parallel}" if opts.max_parallel else ""
    array = [
        *_header("llmctl-dedup-sig", job_dir, opts, "slurm-%A_%a.out"),
        f"#SBATCH --array=0-{num_chunks - 1}{throttle}",
        "set -euo pipefail",
        f"exec {py} -m llmctl.data.slurm signatures {job_json} " + '"$SLURM_ARRAY_TASK_ID"',
    ]
    final = [
        *_header("llmctl-dedup-cluster", job_dir, opts, "slurm-%j.out"),
        "#SBATCH --kill-on-invalid-dep=yes",
        "set -euo pipefail",
        f"exec {py} -m llmctl.data.slurm finish {job_json}",
    ]
    return {ARRAY_SCRIPT: "\n".join(array) + "\n", FINAL_SCRIPT: "\n".join(final) + "\n"}


def _sbatch(args: list[str]) -> str:
    try:
        out = subprocess.run(
            ["sbatch", "--parsable", *args], capture_output=True, text=True, check=True
        )
    except FileNotFoundError:
        raise UserError("sbatch not found: is SLURM installed on this machine?") from None
    except subprocess.CalledProcessError as e:
        raise UserError(f"sbatch failed: {e.stderr.strip() or e.stdout.strip()}") from None
    return out.stdout.strip().split(";")[0]


def execute_dedup_scripts(job_dir: Path) -> tuple[str, str]:
    """Submit the array, then the final job after it; return both job ids."""
    array_id = _sbatch([str(job_dir / ARRAY_SCRIPT)])
    final_id = _sbatch([f"--dependency=afterok:{array_id}", str(job_dir / FINAL_SCRIPT)])
    return array_id, final_id


def _save_job(job_dir: Path, cfg: DedupConfig, chunks: list[Chunk], scans: list[FileScan]) -> None:
    payload = {
        "config": {k: (str(v) if hasattr(v, "value") else v) for k, v in asdict(cfg).items()},
        "chunks": [{**asdict(c), "kind": c.kind.value} for c in chunks],
        "scans": [[str(s.path), s.num_bytes, s.sha256] for s in scans],
        "submitted": time.time(),
    }
    write_json_atomic(job_dir / "job.json", payload)


def load_job(job_json: Path) -> tuple[DedupConfig, list[Chunk], list[FileScan]]:
    """Read back what `submit_dedup` saved."""
    data = read_json(job_json)
    if data is None:
        raise UserError(f"{job_json}: missing or not JSON")
    c = dict(data["config"])
    c.update(
        mode=DedupMode(c["mode"]),
        unit=ShingleUnit(c["unit"]),
        verify=Verify(c["verify"]),
        on_error=OnError(c["on_error"]),
    )
    cfg = DedupConfig(**c)
    chunks = [
        Chunk(**{**ch, "kind": InputKind(ch["kind"]), "paths": tuple(ch["paths"])})
        for ch in data["chunks"]
    ]
    scans = [FileScan(Path(p), n, sha, ()) for p, n, sha in data["scans"]]
    return cfg, chunks, scans


def submit_dedup(
    cfg: DedupConfig, opts: SlurmOptions, *, render_only: bool = False
) -> dict[str, Any]:
    """Plan, write the job folder and scripts, and (unless render_only) submit them."""
    cfg.validate()
    if cfg.dry_run or cfg.output_dir is None:
        raise UserError("--launcher slurm needs --output-dir (use --print-script to preview)")
    chunks, scans = plan(cfg)
    job_dir = prepare_work_dir(cfg, chunks, scans)
    _save_job(job_dir, cfg, chunks, scans)
    scripts = render_dedup_scripts(job_dir, len(chunks), opts, sys.executable)
    for name, text in scripts.items():
        (job_dir / name).write_text(text)
    result: dict[str, Any] = {"job_dir": str(job_dir), "num_tasks": len(chunks)}
    if render_only:
        result["text"] = "\n".join(f"# --- {n}\n{t}" for n, t in scripts.items())
        return result
    array_id, final_id = execute_dedup_scripts(job_dir)
    report = Path(cfg.output_dir) / "dedup_report.json"
    result.update(array_job=array_id, final_job=final_id, report=str(report))
    result["text"] = (
        f"submitted array job {array_id} ({len(chunks)} tasks) and clustering job {final_id}; "
        f"report will be at {report}"
    )
    return result


def main(argv: list[str]) -> None:
    """Entry point of the sbatch scripts."""
    step, job_json = argv[0], Path(argv[1])
    cfg, chunks, scans = load_job(job_json)
    if step == "signatures":
        task = int(argv[2])
        if (job_json.parent / f"sig_{task:06d}.done.json").exists():
            print(f"chunk {task} already done")
            return
        print(json.dumps(signature_shard(chunks[task], cfg, job_json.parent)))
    elif step == "finish":
        report = finish(cfg, chunks, scans, job_json.parent, time.perf_counter(), keep_logs=True)
        print(json.dumps({k: v for k, v in report.as_dict().items() if k != "examples"}))
    else:
        raise SystemExit(f"unknown step {step!r}: expected signatures or finish")


if __name__ == "__main__":
    main(sys.argv[1:])
