"""`llmctl data clean`: heuristic quality filters, language ID, decontamination and PII,
streaming by chunk, with the output conventions of `llmctl data dedup`.

One pass per chunk (in parallel with `-j`): read the chunk's documents (`data.readers`: JSONL,
.gz/.zst, Parquet, text), run the steps in order (`clean_config.Step`) until one rejects the
document, and append the kept records to a part file in the work folder
(`<out>.llmctl-tmp`). A chunk's part files and counts are written under temporary names and
marked done last, so a killed run resumes with the chunks it finished. At the end the parts
are joined, per input file, into a staging folder with `clean_report.json` (and
`rejected.jsonl` on request) and renamed into place whole (`data.outputs.commit_dir`):
nothing partial ever sits under the output name.

Output: JSONL. A JSONL input keeps its name (and compression); a record whose text no step
changed is copied byte for byte, a changed one (C4 drops lines, PII placeholders, a
contamination flag) is re-serialised with only those fields changed. Parquet and text inputs
become `<name>.jsonl` with the text field. The report and the rejected file are listed as
metadata in the folder's marker, so `llmctl data dedup clean/` and `llmctl data preprocess
clean/` read the documents only; the report lists every output file's sha256, which dedup's
report and preprocess's manifest record for their inputs: the chain is checkable.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from llmctl.data.clean_config import CleanConfig, Step
from llmctl.data.filters.decontam import DecontamAction, contaminated
from llmctl.data.filters.quality import Doc
from llmctl.data.manifest import file_sha256, read_json, stamp, write_json_atomic
from llmctl.data.outputs import (
    Interrupted,
    OutputLock,
    check_workers,
    command_line,
    fresh_work_dir,
    interruptible,
    resolve_workers,
    stop_code,
    worker_signals,
)
from llmctl.data.readers import (
    BadInputError,
    Chunk,
    Document,
    InputKind,
    ProblemLog,
    discover,
    iter_documents,
    plan_chunks,
)
from llmctl.errors import UserError
from llmctl.staging import check_collisions, check_dir_target, commit_dir

REPORT_NAME = "clean_report.json"
REJECTED_NAME = "rejected.jsonl"
SNIPPET_CHARS = 160


# ---------------------------------------------------------------- the pipeline


@dataclass(slots=True)
class Verdict:
    """What the pipeline decided for one document."""

    step: Step | None
    """The step that rejected it (None: kept)."""
    reason: str | None
    text: str
    changed: bool
    fields: dict[str, Any] = field(default_factory=dict)
    """Record fields to add (a contamination flag)."""


class Pipeline:
    """The configured steps, ready to run (evaluation n-grams loaded once)."""

    def __init__(self, cfg: CleanConfig, eval_hashes: frozenset[int] | None = None) -> None:
        self.cfg = cfg
        self.steps = cfg.ordered_steps()
        if eval_hashes is None and Step.DECONTAM in self.steps:
            eval_hashes = cfg.decontam.load()
        self.eval_hashes = eval_hashes or frozenset()
        self.pii_counts: Counter[str] = Counter()
        self.languages: Counter[str] = Counter()
        self.num_flagged = 0

    def run(self, text: str) -> Verdict:
        """Run the steps on one text until one rejects it."""
        doc = Doc(text)
        extra: dict[str, Any] = {}
        for step in self.steps:
            reason = self._step(step, doc, extra)
            if reason is not None:
                return Verdict(step, reason, doc.text, doc.text != text)
        return Verdict(None, None, doc.text, doc.text != text or bool(extra), extra)

    def _step(self, step: Step, doc: Doc, extra: dict[str, Any]) -> str | None:
        cfg = self.cfg
        if step is Step.LANGUAGE:
            reason, lang, _score = cfg.language.check(doc.text)
            self.languages[lang] += 1
            return reason
        if step is Step.DECONTAM:
            if not contaminated(doc.text, cfg.decontam.ngram, self.eval_hashes):
                return None
            if cfg.decontam.action is DecontamAction.DROP:
                return "contaminated"
            self.num_flagged += 1
            extra["contamination"] = True
            return None
        if step is Step.PII:
            text, counts = cfg.pii.redact(doc.text)
            self.pii_counts.update(counts)
            doc.rewrite(text)
            return None
        checker: Any = getattr(cfg, step.value)
        result: str | None = checker.check(doc)
        return result


# ---------------------------------------------------------------- counts


@dataclass(slots=True)
class StepCounts:
    """Documents one step removed, by reason, with a few examples."""

    num_removed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, reason: str, where: str, text: str, max_examples: int) -> None:
        """Count one removal."""
        self.num_removed += 1
        self.reasons[reason] += 1
        if len(self.examples) < max_examples:
            snippet = " ".join(text[:SNIPPET_CHARS].split())
            self.examples.append({"where": where, "reason": reason, "snippet": snippet})

    def merge(self, other: dict[str, Any], max_examples: int) -> None:
        """Fold a chunk's counts (JSON form) in."""
        self.num_removed += other["num_removed"]
        self.reasons.update(other["reasons"])
        room = max_examples - len(self.examples)
        self.examples.extend(other["examples"][: max(room, 0)])

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "num_removed": self.num_removed,
            "reasons": dict(self.reasons.most_common()),
            "examples": self.examples,
        }


@dataclass(slots=True)
class ChunkResult:
    """Counts of one chunk (or of a dry run's sample)."""

    index: int
    num_docs: int = 0
    num_kept: int = 0
    num_changed: int = 0
    num_bytes: int = 0
    steps: dict[str, StepCounts] = field(default_factory=dict)
    pii: dict[str, int] = field(default_factory=dict)
    languages: dict[str, int] = field(default_factory=dict)
    num_flagged: int = 0
    problems: ProblemLog = field(default_factory=ProblemLog)
    parts: list[str] = field(default_factory=list)
    """Input path of each part file, in part order."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "index": self.index, "num_docs": self.num_docs, "num_kept": self.num_kept,
            "num_changed": self.num_changed, "num_bytes": self.num_bytes,
            "steps": {k: v.as_dict() for k, v in self.steps.items()}, "pii": self.pii,
            "languages": self.languages, "num_flagged": self.num_flagged,
            "problems": self.problems.as_dict(), "parts": self.parts,
        }  # fmt: skip


# ---------------------------------------------------------------- one chunk


def _record(doc: Document, verdict: Verdict, kind: InputKind, text_field: str) -> bytes:
    """The output line of a kept document: its input line when unchanged."""
    if kind is InputKind.JSONL and doc.raw is not None and not verdict.changed:
        return doc.raw if doc.raw.endswith(b"\n") else doc.raw + b"\n"
    record: dict[str, Any] = {}
    if kind is InputKind.JSONL and doc.raw is not None:
        record = json.loads(doc.raw)
    record[text_field] = verdict.text
    record.update(verdict.fields)
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


class _Parts:
    """The part files of one chunk: one per input path, opened on first use."""

    def __init__(self, work_dir: Path, index: int) -> None:
        self.work_dir, self.index = work_dir, index
        self.files: dict[str, IO[bytes]] = {}
        self.order: list[str] = []

    def path(self, k: int) -> Path:
        return self.work_dir / f"part_{self.index:06d}_{k:04d}.jsonl.tmp"

    def write(self, source: str, line: bytes) -> None:
        if source not in self.files:
            self.files[source] = open(self.path(len(self.order)), "wb")  # noqa: SIM115
            self.order.append(source)
        self.files[source].write(line)

    def close(self, commit: bool) -> None:
        for f in self.files.values():
            f.close()
        for k in range(len(self.order)):
            tmp = self.path(k)
            if commit:
                os.replace(tmp, tmp.with_suffix(""))
            else:
                tmp.unlink(missing_ok=True)


def clean_documents(
    docs: Iterator[Document],
    pipeline: Pipeline,
    result: ChunkResult,
    kind: InputKind,
    write: Callable[[str, bytes], None] | None,
    reject: Callable[[bytes], object] | None,
    limit: int | None = None,
) -> None:
    """Run the pipeline over `docs`, counting into `result`; write kept records (and
    rejected ones) through the given callbacks (None: count only)."""
    cfg = pipeline.cfg
    for doc in docs:
        result.num_docs += 1
        result.num_bytes += doc.num_bytes
        verdict = pipeline.run(doc.text)
        if verdict.step is None:
            result.num_kept += 1
            result.num_changed += verdict.changed
            if write is not None:
                write(doc.path, _record(doc, verdict, kind, cfg.text_field))
        else:
            assert verdict.reason is not None
            counts = result.steps.setdefault(verdict.step.value, StepCounts())
            counts.add(verdict.reason, f"{doc.path}:{doc.line}", doc.text, cfg.num_examples)
            if reject is not None:
                line = {"step": verdict.step.value, "reason": verdict.reason,
                        "path": doc.path, "line": doc.line, cfg.text_field: doc.text}  # fmt: skip
                reject((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
        if limit is not None and result.num_docs >= limit:
            break
    result.pii = dict(pipeline.pii_counts)
    result.languages = dict(pipeline.languages)
    result.num_flagged = pipeline.num_flagged


def clean_chunk(chunk: Chunk, cfg: CleanConfig, work_dir: Path) -> dict[str, Any]:
    """Clean one chunk into its part files; write and return its counts (`done_<i>.json`)."""
    result = ChunkResult(chunk.index)
    parts = _Parts(work_dir, chunk.index)
    rejected: IO[bytes] | None = None
    rej_path = work_dir / f"rejected_{chunk.index:06d}.jsonl.tmp"
    if cfg.write_rejected:
        rejected = open(rej_path, "wb")  # noqa: SIM115
    ok = False
    try:
        docs = iter_documents(
            chunk, text_field=cfg.text_field, on_error=cfg.on_error, log=result.problems
        )
        clean_documents(docs, _pipeline(cfg), result, chunk.kind, parts.write,
                        rejected.write if rejected else None)  # fmt: skip
        ok = True
    finally:
        parts.close(commit=ok)
        if rejected is not None:
            rejected.close()
            if ok:
                os.replace(rej_path, rej_path.with_suffix(""))
            else:
                rej_path.unlink(missing_ok=True)
    result.parts = parts.order
    out = result.as_dict()
    write_json_atomic(work_dir / f"done_{chunk.index:06d}.json", out)
    return out


_STATE: dict[str, Any] = {}


def _pipeline(cfg: CleanConfig) -> Pipeline:
    """A fresh pipeline (counts at zero); a process loads the evaluation n-grams once."""
    if _STATE.get("eval_cfg") is not cfg:
        _STATE.update(eval_cfg=cfg, eval_hashes=Pipeline(cfg).eval_hashes)
    return Pipeline(cfg, _STATE["eval_hashes"])


def _init(cfg: CleanConfig, work_dir: str) -> None:
    worker_signals()
    _STATE.update(cfg=cfg, work_dir=Path(work_dir))


def _task(chunk: Chunk) -> dict[str, Any]:
    return clean_chunk(chunk, _STATE["cfg"], _STATE["work_dir"])


def run_chunks(
    cfg: CleanConfig, chunks: list[Chunk], work_dir: Path, on_done: Callable[[dict[str, Any]], None]
) -> None:
    """Clean the chunks not done yet, here or in `-j` worker processes."""
    todo = [c for c in chunks if not (work_dir / f"done_{c.index:06d}.json").exists()]
    num_workers = min(resolve_workers(cfg.num_workers), max(len(todo), 1))
    if num_workers <= 1:
        for c in todo:
            on_done(clean_chunk(c, cfg, work_dir))
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(num_workers, _init, (cfg, str(work_dir))) as pool:
        for r in pool.imap_unordered(_task, todo):
            on_done(r)


# ---------------------------------------------------------------- report and output


def common_root(chunks: list[Chunk]) -> Path:
    paths = [Path(p).resolve() for c in chunks for p in c.paths]
    return Path(os.path.commonpath([p.parent for p in paths])) if paths else Path(".")


def output_name(path: str, kind: InputKind, root: Path) -> str:
    """Where an input file's kept documents go, relative to the output folder."""
    p = Path(path).resolve()
    try:
        rel = p.relative_to(root)
    except ValueError:
        rel = Path(p.name)
    return str(rel) if kind is InputKind.JSONL else f"{rel}.jsonl"


def build_report(cfg: CleanConfig, results: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """Totals over chunks: per step the count and share removed, reasons and examples."""
    num_docs = sum(r["num_docs"] for r in results)
    steps = {s.value: StepCounts() for s in cfg.ordered_steps()}
    pii: Counter[str] = Counter()
    languages: Counter[str] = Counter()
    problems = ProblemLog()
    for r in sorted(results, key=lambda r: r["index"]):
        for name, counts in r["steps"].items():
            steps[name].merge(counts, cfg.num_examples)
        pii.update(r["pii"])
        languages.update(r["languages"])
        part = ProblemLog()
        part.counts.update(r["problems"]["counts"])
        part.examples.extend(r["problems"]["examples"])
        problems.merge(part)
    num_kept = sum(r["num_kept"] for r in results)
    return {
        **stamp(),
        "num_docs": num_docs,
        "num_kept": num_kept,
        "num_removed": num_docs - num_kept,
        "share_removed": round((num_docs - num_kept) / num_docs, 6) if num_docs else 0.0,
        "num_changed": sum(r["num_changed"] for r in results),
        "steps": {
            name: {**c.as_dict(), "share_removed": round(c.num_removed / num_docs, 6)}
            for name, c in steps.items()
        } if num_docs else {},
        "pii_replaced": dict(pii),
        "languages": dict(languages.most_common()),
        "num_contamination_flagged": sum(r["num_flagged"] for r in results),
        "params": cfg.params(),
        "problems": problems.as_dict(),
        "dry_run": cfg.dry_run,
        "output_dir": None if cfg.dry_run else cfg.output_dir,
        "elapsed_s": round(time.perf_counter() - started, 3),
    }  # fmt: skip


def _join_parts(
    chunks: list[Chunk], results: dict[int, dict[str, Any]], work_dir: Path, stage: Path
) -> list[str]:
    """Concatenate the part files, per input file in chunk order, into `stage`."""
    from llmctl.data.writers import open_binary_write

    root = common_root(chunks)
    outputs: dict[str, IO[bytes]] = {}
    try:
        for chunk in chunks:
            for k, source in enumerate(results[chunk.index]["parts"]):
                name = output_name(source, chunk.kind, root)
                if name not in outputs:
                    outputs[name] = open_binary_write(stage / name)
                part = work_dir / f"part_{chunk.index:06d}_{k:04d}.jsonl"
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, outputs[name], 1 << 20)
    finally:
        for out in outputs.values():
            out.close()
    return sorted(outputs)


def _join_rejected(chunks: list[Chunk], work_dir: Path, stage: Path) -> None:
    with open(stage / REJECTED_NAME, "wb") as out:
        for chunk in chunks:
            part = work_dir / f"rejected_{chunk.index:06d}.jsonl"
            if part.exists():
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)


def finish(
    cfg: CleanConfig,
    chunks: list[Chunk],
    scans: list[Any],
    work_dir: Path,
    started: float,
    keep_logs: bool = False,
) -> dict[str, Any]:
    """Join the chunks' outputs, write the report, rename the folder into place.

    The work folder is removed at the end; with `keep_logs` (SLURM) the job's `job.json`,
    scripts and logs stay and only the parts go.
    """
    results = {c.index: read_json(work_dir / f"done_{c.index:06d}.json") for c in chunks}
    done = {i: r for i, r in results.items() if r is not None}
    report = build_report(cfg, list(done.values()), started)
    if report["num_docs"] == 0:
        shutil.rmtree(work_dir, ignore_errors=True)
        skipped = report["problems"]["counts"] or "none"
        raise UserError(f"no documents in {', '.join(cfg.inputs)} (skipped: {skipped})")
    assert cfg.output_dir is not None
    stage = work_dir / "out"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    names = _join_parts(chunks, done, work_dir, stage)
    metadata = [REPORT_NAME]
    if cfg.write_rejected:
        _join_rejected(chunks, work_dir, stage)
        metadata.append(REJECTED_NAME)
    payload = {
        **report,
        "inputs": [{"path": str(s.path), "sha256": s.sha256} for s in scans],
        "outputs": [{"path": n, "sha256": file_sha256(stage / n)} for n in names],
        "command": command_line(),
    }
    write_json_atomic(stage / REPORT_NAME, payload)
    commit_dir(stage, Path(cfg.output_dir), "clean", metadata=tuple(metadata))
    _remove_work(work_dir, keep_logs)
    return payload


def _remove_work(work_dir: Path, keep_logs: bool) -> None:
    if not keep_logs:
        shutil.rmtree(work_dir, ignore_errors=True)
        return
    for p in work_dir.iterdir():
        if p.name == "job.json" or p.suffix in (".sbatch", ".out"):
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# ---------------------------------------------------------------- driver


def validate(cfg: CleanConfig) -> None:
    """Raises UserError for impossible settings, before any work."""
    check_workers(cfg.num_workers)
    if not cfg.steps:
        raise UserError("clean: no steps chosen")
    if Step.DECONTAM in cfg.steps:
        if not cfg.decontam.eval_files:
            raise UserError("decontam needs evaluation files (--decontam FILE)")
        cfg.decontam.load()  # a missing or malformed evaluation file: before any write
    if Step.LANGUAGE in cfg.steps:
        from llmctl.data.filters.langid import identifier

        identifier()
        unknown = set(cfg.language.languages) - set(identifier().labels)
        if unknown:
            raise UserError(f"unknown language code(s) {sorted(unknown)} (py3langid's labels)")
    if cfg.dry_run:
        return
    if cfg.output_dir is None:
        raise UserError("clean needs an output folder (--out DIR, or --dry-run)")
    check_dir_target(Path(cfg.output_dir), cfg.force, "clean")


def work_dir_for(cfg: CleanConfig) -> Path:
    """Where parts live while a run is in progress (skipped by every reader)."""
    assert cfg.output_dir is not None
    out = Path(cfg.output_dir).resolve()
    return out.with_name(out.name + ".llmctl-tmp")


def prepare_work_dir(cfg: CleanConfig, chunks: list[Chunk], scans: list[Any]) -> Path:
    """The work folder, discarding one made for other inputs or settings."""
    work_dir = work_dir_for(cfg)
    fingerprint = {
        "params": cfg.params(),
        "write_rejected": cfg.write_rejected,
        "inputs": [[str(s.path), s.sha256] for s in scans],
        "chunks": [[list(c.paths), c.start, c.end] for c in chunks],
    }
    return fresh_work_dir(work_dir, fingerprint)


def dry_run(cfg: CleanConfig, chunks: list[Chunk], started: float) -> dict[str, Any]:
    """Clean the first `sample_docs` documents in this process and report; write nothing."""
    result = ChunkResult(0)
    pipeline = Pipeline(cfg)
    for chunk in chunks:
        left = cfg.sample_docs - result.num_docs
        if left <= 0:
            break
        docs = iter_documents(
            chunk, text_field=cfg.text_field, on_error=cfg.on_error, log=result.problems
        )
        clean_documents(docs, pipeline, result, chunk.kind, None, None, limit=left)
    report = build_report(cfg, [result.as_dict()], started)
    report["sample_docs"] = cfg.sample_docs
    return report


def clean(
    cfg: CleanConfig, on_progress: Callable[[int, int, int], None] | None = None
) -> dict[str, Any]:
    """Clean `cfg.inputs` on this machine; return the report.

    Args:
        cfg: the run's options.
        on_progress: called with (total bytes, docs done, bytes done) as chunks finish.

    Raises:
        UserError: bad options, or bad input under on_error=fail (naming file and line).
        Interrupted: Ctrl-C or SIGTERM; finished chunks are kept for a rerun to resume.
    """
    validate(cfg)
    started = time.perf_counter()
    try:
        if cfg.dry_run:
            chunks, _ = plan_chunks(discover(list(cfg.inputs)), cfg.chunk_bytes)
            return dry_run(cfg, chunks, started)
        assert cfg.output_dir is not None
        with OutputLock(Path(cfg.output_dir)):
            return _clean_here(cfg, on_progress, started)
    except BadInputError as e:
        raise UserError(f"{e}; use --on-error skip to skip and count such documents") from None


def _clean_here(
    cfg: CleanConfig, on_progress: Callable[[int, int, int], None] | None, started: float
) -> dict[str, Any]:
    chunks, scans = plan_chunks(discover(list(cfg.inputs)), cfg.chunk_bytes)
    root = common_root(chunks)
    names = {output_name(p, c.kind, root) for c in chunks for p in c.paths}
    check_collisions(Path(str(cfg.output_dir)), sorted(names | {REPORT_NAME, REJECTED_NAME}))
    work_dir = prepare_work_dir(cfg, chunks, scans)
    total = sum(c.num_bytes for c in chunks)
    report = on_progress or (lambda _t, _d, _b: None)
    report(total, 0, 0)
    try:
        with interruptible():
            run_chunks(cfg, chunks, work_dir,
                       lambda r: report(total, r["num_docs"], r["num_bytes"]))  # fmt: skip
    except BadInputError:
        shutil.rmtree(work_dir, ignore_errors=True)  # the input must change before a rerun
        raise
    except BaseException as e:
        code = stop_code(e)
        if code is None:
            raise
        done = len(list(work_dir.glob("done_*.json")))
        raise Interrupted(
            f"interrupted: {done} of {len(chunks)} chunks cleaned and kept in {work_dir}; "
            "run the same command again to resume",
            code,
        ) from None
    return finish(cfg, chunks, scans, work_dir, started)


def run_clean(cfg: CleanConfig, progress: Any) -> dict[str, Any]:
    """`llmctl data clean` with a `llmctl.progress.ByteProgress` (the CLI's one call)."""

    def update(total: int, docs: int, num_bytes: int) -> None:
        progress.update(total=total, num_bytes=num_bytes, docs=docs)

    with progress:
        return clean(cfg, on_progress=update)
