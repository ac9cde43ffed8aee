"""`llmctl data dedup|preprocess --launcher slurm`: an array job over input chunks, then one
dependent job that finishes (dedup: clustering and output; preprocess: merge and commit).

Render, then execute. `render_dedup_scripts` is pure: from a job folder and the number of
chunks it returns two sbatch scripts, an array job whose task i computes the signatures and
LSH band keys of input chunk i (`signature_shard`), and a final job that clusters, reports and
writes the kept documents (`dedup.finish`). `_stage_and_submit` is the one function that
submits (`llmctl.sbatch.submit`, shared with training jobs): the final job depends on the array
(`--dependency=afterok:<array id>`), so it runs only when every shard succeeded. A failed array
task can be resubmitted alone; finished shards are kept (their `.done.json` markers) and skipped.

The job folder (beside the output folder, `<output>.llmctl-tmp/`) holds `job.json` (the
options and the chunk plan), the scripts, the shards and the SLURM logs; it must be on a file
system every node sees, and every node must run the same Python (`sys.executable`).
The inputs are checked before the folder is made (each chunk read up to its first document: a
bad first record or no document at all is one line, exit code 2); `--print-script` renders the
scripts to stdout and writes nothing.
Run as a module, this file is what the scripts call: `python -m llmctl.data.slurm
signatures|finish|preprocess-shard|preprocess-merge|clean-chunk|clean-join JOB_JSON
[TASK_ID]` (clean's steps live in `llmctl.data.clean_slurm`).

`preprocess` works the same way: array task i tokenizes chunk i into
`<prefix>.llmctl-tmp/shard_<i>` (skipped when already done), and the merge job concatenates the
shards in chunk order and commits `.bin`, `.idx` and the manifest under the prefix's lock, so the
output is byte-identical to a local run (tested on the local cluster). Tasks read the chunk plan
saved at submission (input checksums included) and do not re-hash the inputs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from llmctl.data.choices import DedupMode, TokenizerKind, Verify
from llmctl.data.dedup import (
    DedupConfig,
    finish,
    output_names,
    plan,
    prepare_work_dir,
    signature_shard,
    work_dir_for,
)
from llmctl.data.manifest import read_json, write_json_atomic
from llmctl.data.minhash import SIGNATURE_SCHEME, ShingleUnit
from llmctl.data.outputs import OutputLock, command_line
from llmctl.data.preprocess import (
    PreprocessConfig,
    RunPlan,
    finish_run,
    output_paths,
    plan_run,
    run_chunk_here,
    stage_run,
)
from llmctl.data.readers import (
    DEFAULT_MAX_DOC_BYTES,
    BadInputError,
    Chunk,
    FileScan,
    InputKind,
    OnError,
    iter_documents,
)
from llmctl.data.tokenizer import Tokenizer, TokenizerSpec
from llmctl.errors import UserError
from llmctl.sbatch import submit
from llmctl.staging import check_collisions, check_file_targets

ARRAY_SCRIPT = "dedup_signatures.sbatch"
FINAL_SCRIPT = "dedup_cluster.sbatch"
PRE_ARRAY_SCRIPT = "preprocess_shards.sbatch"
PRE_FINAL_SCRIPT = "preprocess_merge.sbatch"


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


def _render_pair(
    job_dir: Path,
    num_chunks: int,
    opts: SlurmOptions,
    python: str,
    names: tuple[str, str, str, str],
) -> tuple[str, str]:
    """An array script running step `names[1]` per task and a final one running `names[3]`."""
    job_json = shlex.quote(str(job_dir / "job.json"))
    py = shlex.quote(python)
    throttle = f"%{opts.max_parallel}" if opts.max_parallel else ""
    array = [
        *_header(names[0], job_dir, opts, "slurm-%A_%a.out"),
        f"#SBATCH --array=0-{num_chunks - 1}{throttle}",
        "set -euo pipefail",
        f"exec {py} -m llmctl.data.slurm {names[1]} {job_json} " + '"$SLURM_ARRAY_TASK_ID"',
    ]
    final = [
        *_header(names[2], job_dir, opts, "slurm-%j.out"),
        "#SBATCH --kill-on-invalid-dep=yes",
        "set -euo pipefail",
        f"exec {py} -m llmctl.data.slurm {names[3]} {job_json}",
    ]
    return "\n".join(array) + "\n", "\n".join(final) + "\n"


def render_dedup_scripts(
    job_dir: Path, num_chunks: int, opts: SlurmOptions, python: str
) -> dict[str, str]:
    """The two dedup sbatch scripts (pure): {file name: text}."""
    names = ("llmctl-dedup-sig", "signatures", "llmctl-dedup-cluster", "finish")
    array, final = _render_pair(job_dir, num_chunks, opts, python, names)
    return {ARRAY_SCRIPT: array, FINAL_SCRIPT: final}


def render_preprocess_scripts(
    job_dir: Path, num_chunks: int, opts: SlurmOptions, python: str
) -> dict[str, str]:
    """The two preprocess sbatch scripts (pure): {file name: text}."""
    names = ("llmctl-pre-shard", "preprocess-shard", "llmctl-pre-merge", "preprocess-merge")
    array, final = _render_pair(job_dir, num_chunks, opts, python, names)
    return {PRE_ARRAY_SCRIPT: array, PRE_FINAL_SCRIPT: final}


def _save_job(job_dir: Path, cfg: DedupConfig, chunks: list[Chunk], scans: list[FileScan]) -> None:
    payload = {
        "config": {k: (str(v) if hasattr(v, "value") else v) for k, v in asdict(cfg).items()},
        "chunks": [{**asdict(c), "kind": c.kind.value} for c in chunks],
        "scans": [[str(s.path), s.num_bytes, s.sha256] for s in scans],
        "signature_scheme": SIGNATURE_SCHEME,
        "submitted": time.time(),
    }
    write_json_atomic(job_dir / "job.json", payload)


def load_job(job_json: Path) -> tuple[DedupConfig, list[Chunk], list[FileScan]]:
    """Read back what `submit_dedup` saved."""
    data = read_json(job_json)
    if data is None:
        raise UserError(f"{job_json}: missing or not JSON")
    if data.get("signature_scheme") != SIGNATURE_SCHEME:
        raise UserError(
            f"{job_json}: signatures of scheme {data.get('signature_scheme', 'v1')!r}, this "
            f"llmctl makes {SIGNATURE_SCHEME!r}; submit the dedup again"
        )
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


def check_inputs(
    chunks: list[Chunk],
    inputs: list[str],
    *,
    text_field: str,
    on_error: OnError | str,
    keep_empty: bool = False,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
) -> None:
    """Read each chunk up to its first document, before anything is staged or submitted: a bad
    first record (under on_error=fail) or no document in any chunk is a user error now, not a
    failed array task later.

    Raises:
        UserError: the bad record (file:line: problem), or "no documents in INPUTS".
    """
    found = False
    for chunk in chunks:
        docs = iter_documents(
            chunk,
            text_field=text_field,
            on_error=on_error,
            keep_empty=keep_empty,
            keep_raw=False,
            max_doc_bytes=max_doc_bytes,
        )
        try:
            found = next(docs, None) is not None or found
        except BadInputError as e:
            raise UserError(f"{e}; use --on-error skip to skip and count such documents") from None
        finally:
            getattr(docs, "close", lambda: None)()  # a generator: close its file now
    if not found:
        raise UserError(f"no documents in {', '.join(inputs)}")


def _stage_and_submit(
    job_dir: Path, write: Callable[[], None], array: str, final: str
) -> tuple[str, str]:
    """Write the job folder, submit the array, then the final job after it; return both ids.

    A folder this call created is removed if writing it or submitting the array fails
    (nothing runs from it then); once the array is submitted it stays.
    """
    existed = job_dir.exists()
    try:
        write()
        array_id = submit([str(job_dir / array)])
    except BaseException:
        if not existed:
            shutil.rmtree(job_dir, ignore_errors=True)
        raise
    final_id = submit([f"--dependency=afterok:{array_id}", str(job_dir / final)])
    return array_id, final_id


def _rendered(job_dir: Path, num_tasks: int, scripts: dict[str, str]) -> dict[str, Any]:
    text = "\n".join(f"# --- {n}\n{t}" for n, t in scripts.items())
    return {"job_dir": str(job_dir), "num_tasks": num_tasks, "text": text}


def submit_dedup(
    cfg: DedupConfig, opts: SlurmOptions, *, render_only: bool = False
) -> dict[str, Any]:
    """Plan and check the inputs; then either render the scripts (`render_only`: nothing is
    written), or write the job folder and scripts and submit them.

    Raises:
        UserError: bad options, a bad first record or no documents, or sbatch failing (the job
            folder is then removed unless an earlier submission made it).
    """
    cfg.validate()
    if cfg.dry_run or cfg.output_dir is None:
        raise UserError("--launcher slurm needs --out DIR (use --print-script to preview)")
    chunks, scans = plan(cfg)
    check_collisions(Path(cfg.output_dir), output_names(chunks))
    check_inputs(chunks, list(cfg.inputs), text_field=cfg.text_field, on_error=cfg.on_error)
    job_dir = work_dir_for(cfg)
    scripts = render_dedup_scripts(job_dir, len(chunks), opts, sys.executable)
    if render_only:
        return _rendered(job_dir, len(chunks), scripts)

    def write() -> None:
        prepare_work_dir(cfg, chunks, scans)
        _save_job(job_dir, cfg, chunks, scans)
        for name, text in scripts.items():
            (job_dir / name).write_text(text)

    array_id, final_id = _stage_and_submit(job_dir, write, ARRAY_SCRIPT, FINAL_SCRIPT)
    report = Path(cfg.output_dir) / "dedup_report.json"
    result: dict[str, Any] = {"job_dir": str(job_dir), "num_tasks": len(chunks)}
    result.update(array_job=array_id, final_job=final_id, report=str(report))
    result["text"] = (
        f"submitted array job {array_id} ({len(chunks)} tasks) and clustering job {final_id}; "
        f"report will be at {report}"
    )
    return result


# ---------------------------------------------------------------- preprocess


def _save_preprocess_job(job_dir: Path, cfg: PreprocessConfig, run: RunPlan) -> None:
    payload = {
        "config": {k: (v.value if hasattr(v, "value") else v) for k, v in asdict(cfg).items()},
        "chunks": [{**asdict(c), "kind": c.kind.value} for c in run.chunks],
        "plan": run.plan,
        "spec": [str(run.spec.path), run.spec.kind.value, run.spec.eod_token],
        "command": command_line(),
        "submitted": time.time(),
    }
    write_json_atomic(job_dir / "job.json", payload)


def load_preprocess_job(job_json: Path) -> tuple[PreprocessConfig, RunPlan]:
    """Read back what `submit_preprocess` saved (no input is re-read or re-hashed)."""
    data = read_json(job_json)
    if data is None:
        raise UserError(f"{job_json}: missing or not JSON")
    cfg = PreprocessConfig(**{**data["config"], "on_error": OnError(data["config"]["on_error"])})
    chunks = [
        Chunk(**{**ch, "kind": InputKind(ch["kind"]), "paths": tuple(ch["paths"])})
        for ch in data["chunks"]
    ]
    path, kind, eod = data["spec"]
    spec = TokenizerSpec(Path(path), TokenizerKind(kind), eod)
    run = RunPlan(spec, Tokenizer(spec), chunks, data["plan"], job_json.parent, set())
    run.command = {**data["command"], "slurm_job": os.environ.get("SLURM_JOB_ID")}
    return cfg, run


def submit_preprocess(
    cfg: PreprocessConfig, opts: SlurmOptions, *, render_only: bool = False
) -> dict[str, Any]:
    """Plan and check the inputs; then either render the scripts (`render_only`: nothing is
    written), or write the job folder and scripts and submit them.

    Raises:
        UserError: see `submit_dedup`.
    """
    prefix = Path(cfg.output_prefix).absolute()
    check_file_targets(output_paths(prefix), cfg.force, f"the dataset {prefix}")
    cfg = replace(
        cfg,
        output_prefix=str(prefix),
        inputs=[str(Path(p).absolute()) for p in cfg.inputs],
        tokenizer=str(Path(cfg.tokenizer).absolute()),
    )
    run = plan_run(cfg, prefix, stage=False)
    check_inputs(
        run.chunks,
        list(cfg.inputs),
        text_field=cfg.text_field,
        on_error=cfg.on_error,
        keep_empty=not cfg.drop_empty,
        max_doc_bytes=cfg.max_doc_bytes,
    )
    scripts = render_preprocess_scripts(run.work_dir, len(run.chunks), opts, sys.executable)
    if render_only:
        return _rendered(run.work_dir, len(run.chunks), scripts)

    def write() -> None:
        with OutputLock(prefix):
            stage_run(run, prefix)
            _save_preprocess_job(run.work_dir, cfg, run)
            for name, text in scripts.items():
                (run.work_dir / name).write_text(text)

    work_dir = run.work_dir
    array_id, final_id = _stage_and_submit(work_dir, write, PRE_ARRAY_SCRIPT, PRE_FINAL_SCRIPT)
    result: dict[str, Any] = {"job_dir": str(run.work_dir), "num_tasks": len(run.chunks)}
    result.update(array_job=array_id, final_job=final_id, prefix=str(prefix))
    result["text"] = (
        f"submitted array job {array_id} ({len(run.chunks)} tasks) and merge job {final_id}; "
        f"the dataset will be {prefix}.bin/.idx (manifest {prefix}.manifest.json)"
    )
    return result


def _preprocess_step(step: str, job_json: Path, argv: list[str]) -> dict[str, Any]:
    cfg, run = load_preprocess_job(job_json)
    if step == "preprocess-shard":
        try:
            return run_chunk_here(cfg, run, int(argv[0]))
        except BadInputError as e:
            raise UserError(f"{e}; use --on-error skip to skip and count such documents") from None
    prefix = Path(cfg.output_prefix)
    with OutputLock(prefix):
        summary = finish_run(cfg, prefix, run, time.perf_counter(), 1, keep_logs=True)
        return summary.as_dict()


def main(argv: list[str]) -> None:
    """Entry point of the sbatch scripts; a user error is one line and exit code 2."""
    try:
        _main(argv)
    except UserError as e:
        print(f"error: {e.message}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None


def _main(argv: list[str]) -> None:
    step, job_json = argv[0], Path(argv[1])
    if step.startswith("clean-"):
        from llmctl.data.clean_slurm import clean_step

        print(json.dumps(clean_step(step, job_json, argv[2:])))
        return
    if step.startswith("preprocess-"):
        print(json.dumps(_preprocess_step(step, job_json, argv[2:])))
        return
    cfg, chunks, scans = load_job(job_json)
    if step == "signatures":
        task = int(argv[2])
        if (job_json.parent / f"sig_{task:06d}.done.json").exists():
            print(f"chunk {task} already done")
            return
        print(json.dumps(signature_shard(chunks[task], cfg, job_json.parent)))
    elif step == "finish":
        with OutputLock(Path(str(cfg.output_dir))):
            report = finish(
                cfg, chunks, scans, job_json.parent, time.perf_counter(), keep_logs=True
            )
        print(json.dumps({k: v for k, v in report.as_dict().items() if k != "examples"}))
    else:
        raise SystemExit(f"unknown step {step!r}: expected signatures or finish")


if __name__ == "__main__":
    main(sys.argv[1:])
