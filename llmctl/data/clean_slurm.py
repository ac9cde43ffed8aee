"""`llmctl data clean --launcher slurm`: an array job cleans the input chunks, one dependent
job joins them and commits the output folder, as `dedup` and `preprocess` do on SLURM.

Array task i runs `clean_chunk` on chunk i into the job folder (`<out>.llmctl-tmp/`; skipped
when its `done_<i>.json` exists, so a failed task can be resubmitted alone); the final job runs
`clean.finish` under the output's lock: the same part files joined in the same order, so the
output is byte-identical to a local run (tested on the local cluster). The job folder keeps
`job.json` (the options and the chunk plan with input checksums), the scripts and the SLURM
logs; the parts go once the output is committed.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from llmctl.data.clean import (
    REJECTED_NAME,
    REPORT_NAME,
    clean_chunk,
    common_root,
    finish,
    output_name,
    prepare_work_dir,
    validate,
    work_dir_for,
)
from llmctl.data.clean_config import SECTIONS, CleanConfig
from llmctl.data.manifest import read_json, write_json_atomic
from llmctl.data.outputs import OutputLock
from llmctl.data.readers import Chunk, FileScan, InputKind, discover, plan_chunks
from llmctl.data.slurm import SlurmOptions, _render_pair, _rendered, _stage_and_submit, check_inputs
from llmctl.errors import UserError
from llmctl.staging import check_collisions

CLEAN_ARRAY_SCRIPT = "clean_chunks.sbatch"
CLEAN_FINAL_SCRIPT = "clean_join.sbatch"
JOB_SCHEME = 1
"""Version of job.json; a job saved by another version is refused, not misread."""


def render_clean_scripts(
    job_dir: Path, num_chunks: int, opts: SlurmOptions, python: str
) -> dict[str, str]:
    """The two clean sbatch scripts (pure): {file name: text}."""
    names = ("llmctl-clean-chunk", "clean-chunk", "llmctl-clean-join", "clean-join")
    array, final = _render_pair(job_dir, num_chunks, opts, python, names)
    return {CLEAN_ARRAY_SCRIPT: array, CLEAN_FINAL_SCRIPT: final}


def _config_dict(cfg: CleanConfig) -> dict[str, Any]:
    return asdict(cfg)  # enums are StrEnums: JSON strings, read back by CleanConfig


def config_from_dict(data: dict[str, Any]) -> CleanConfig:
    """A CleanConfig from `_config_dict`'s output (sections set field by field)."""
    top = {k: v for k, v in data.items() if k not in SECTIONS}
    cfg = CleanConfig(**top)
    for name in SECTIONS:
        section = getattr(cfg, name)
        assert is_dataclass(section)
        for f in fields(section):
            if f.name in data.get(name, {}):
                setattr(section, f.name, data[name][f.name])
    cfg.__post_init__()  # enums of the sections (decontam action) from their strings
    return cfg


def _save_job(job_dir: Path, cfg: CleanConfig, chunks: list[Chunk], scans: list[FileScan]) -> None:
    payload = {
        "scheme": JOB_SCHEME,
        "config": _config_dict(cfg),
        "chunks": [{**asdict(c), "kind": c.kind.value} for c in chunks],
        "scans": [[str(s.path), s.num_bytes, s.sha256] for s in scans],
        "submitted": time.time(),
    }
    write_json_atomic(job_dir / "job.json", payload)


def load_job(job_json: Path) -> tuple[CleanConfig, list[Chunk], list[FileScan], float]:
    """Read back what `submit_clean` saved: (options, chunks, input scans, submission time)."""
    data = read_json(job_json)
    if data is None:
        raise UserError(f"{job_json}: missing or not JSON")
    if data.get("scheme") != JOB_SCHEME:
        raise UserError(f"{job_json}: a clean job of another llmctl version; submit it again")
    chunks = [
        Chunk(**{**ch, "kind": InputKind(ch["kind"]), "paths": tuple(ch["paths"])})
        for ch in data["chunks"]
    ]
    scans = [FileScan(Path(p), n, sha, ()) for p, n, sha in data["scans"]]
    return config_from_dict(data["config"]), chunks, scans, float(data["submitted"])


def submit_clean(
    cfg: CleanConfig, opts: SlurmOptions, *, render_only: bool = False
) -> dict[str, Any]:
    """Plan and check the inputs; then either render the scripts (`render_only`: nothing is
    written), or write the job folder and scripts and submit them.

    Raises:
        UserError: bad options, a bad first record or no documents, or sbatch failing (the job
            folder is then removed unless an earlier submission made it).
    """
    if cfg.dry_run or cfg.output_dir is None:
        raise UserError("--launcher slurm needs --out DIR (use --print-script to preview)")
    cfg.output_dir = str(Path(cfg.output_dir).absolute())
    cfg.inputs = [str(Path(p).absolute()) for p in cfg.inputs]
    validate(cfg)
    chunks, scans = plan_chunks(discover(list(cfg.inputs)), cfg.chunk_bytes)
    root = common_root(chunks)
    names = {output_name(p, c.kind, root) for c in chunks for p in c.paths}
    check_collisions(Path(cfg.output_dir), sorted(names | {REPORT_NAME, REJECTED_NAME}))
    check_inputs(chunks, list(cfg.inputs), text_field=cfg.text_field, on_error=cfg.on_error)
    job_dir = work_dir_for(cfg)
    scripts = render_clean_scripts(job_dir, len(chunks), opts, sys.executable)
    if render_only:
        return _rendered(job_dir, len(chunks), scripts)

    def write() -> None:
        with OutputLock(Path(str(cfg.output_dir))):
            prepare_work_dir(cfg, chunks, scans)
            _save_job(job_dir, cfg, chunks, scans)
            for name, text in scripts.items():
                (job_dir / name).write_text(text)

    array_id, final_id = _stage_and_submit(job_dir, write, CLEAN_ARRAY_SCRIPT, CLEAN_FINAL_SCRIPT)
    report = Path(cfg.output_dir) / REPORT_NAME
    result: dict[str, Any] = {"job_dir": str(job_dir), "num_tasks": len(chunks)}
    result.update(array_job=array_id, final_job=final_id, report=str(report))
    result["text"] = (
        f"submitted array job {array_id} ({len(chunks)} tasks) and join job {final_id}; "
        f"report will be at {report}"
    )
    return result


def clean_step(step: str, job_json: Path, argv: list[str]) -> dict[str, Any]:
    """One step of a submitted clean job: `clean-chunk TASK` or `clean-join`."""
    cfg, chunks, scans, submitted = load_job(job_json)
    work_dir = job_json.parent
    if step == "clean-chunk":
        task = int(argv[0])
        done = read_json(work_dir / f"done_{chunks[task].index:06d}.json")
        return done if done is not None else clean_chunk(chunks[task], cfg, work_dir)
    with OutputLock(Path(str(cfg.output_dir))):
        started = time.perf_counter() - (time.time() - submitted)
        report = finish(cfg, chunks, scans, work_dir, started, keep_logs=True)
    return {k: v for k, v in report.items() if k not in ("steps", "outputs", "inputs")}
