"""`llmctl data preprocess`: documents in, Megatron `.bin/.idx` out, streaming and resumable.

The input is cut into chunks (see `readers`); each worker process tokenizes whole chunks and
writes one shard per chunk under `<prefix>.llmctl-tmp/`, marking it done with a small JSON
file written last. The parent merges finished shards in chunk order, so the output equals a
single sequential pass regardless of worker count, then commits it (see `manifest.commit`).

Memory is bounded by the chunk size: a worker holds one batch of texts and the lengths of one
chunk; the merge holds one shard's lengths at a time. A 10x larger input makes more chunks,
not bigger ones. A document above `STREAM_BYTES` is held once, as its input bytes, and
decoded and tokenized a segment at a time (with a tokenizer that can be cut, see
`tokenizer`); ids go to the shard one engine call at a time. So a worker's peak is a constant
plus about one byte per byte of its largest document (docs/data.md, "Memory").

Restarting after an interruption reuses every shard already done, provided the plan (input
checksums, tokenizer checksum, options) is unchanged; otherwise the work folder is discarded.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.data import indexed
from llmctl.data.manifest import (
    commit,
    manifest_path,
    read_json,
    stamp,
    upstream_report,
    write_json_atomic,
)
from llmctl.data.outputs import (
    Interrupted,
    OutputLock,
    check_workers,
    command_line,
    interruptible,
    resolve_workers,
    stop_code,
    worker_signals,
)
from llmctl.data.readers import (
    DEFAULT_MAX_DOC_BYTES,
    BadInputError,
    Chunk,
    Document,
    FileScan,
    OnError,
    ProblemLog,
    discover,
    iter_documents,
    plan_chunks,
)
from llmctl.data.tokenizer import Text, Tokenizer, TokenizerSpec, resolve_tokenizer
from llmctl.errors import UserError
from llmctl.staging import check_file_targets, make_parent


@dataclass(kw_only=True)
class PreprocessConfig:
    """Options of one preprocess run."""

    inputs: list[str]
    """Input files or folders: JSONL (.gz/.zst), Parquet, or text files (one document each)."""
    output_prefix: str
    """Output path without suffix; writes `<prefix>.bin`, `.idx` and `.manifest.json`."""
    tokenizer: str
    """tokenizer.json (or its folder), SentencePiece .model, or tiktoken ranks file."""
    tokenizer_kind: str | None = None
    """hf, sentencepiece or tiktoken; guessed from the file name when unset."""
    eod_token: str | None = None
    """End-of-document token; the tokenizer's EOS (or <|endoftext|>) when unset."""
    text_field: str = "text"
    """JSONL key or Parquet column holding the text."""
    num_workers: int = 0
    """Worker processes; 0 means one per CPU core."""
    on_error: OnError = OnError.FAIL
    """fail: stop at the first structurally bad document; skip: skip and count it."""
    append_eod: bool = True
    """Append the EOD token to every document (Megatron's --append-eod)."""
    chunk_bytes: int = 32 << 20
    """Input bytes per work unit; bounds worker memory."""
    batch_docs: int = 512
    """Documents tokenized per call, at most."""
    batch_bytes: int = 1 << 20
    """Text bytes tokenized per call, about (bounds the tokenizer's working memory)."""
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES
    """Documents larger than this are bad input."""
    model_vocab_size: int | None = None
    """When set, fail if the tokenizer's vocabulary does not fit the model's."""
    dedup: dict[str, Any] | None = None
    """Dedup parameters to record in the manifest, when the input was deduplicated."""
    drop_empty: bool = False
    """Skip (and count) empty and whitespace-only documents. Off by default: Megatron-LM's
    preprocess_data.py tokenizes whitespace-only documents and records empty ones as a
    document-index entry without tokens, and llmctl's output is byte-identical to it."""
    force: bool = False
    """Replace an existing `<prefix>.bin/.idx/.manifest.json` (nothing else is touched)."""

    def __post_init__(self) -> None:
        try:
            self.on_error = OnError(self.on_error)
        except ValueError:
            raise UserError(f"on_error={self.on_error!r}: expected fail or skip") from None
        for flag, value in (("--chunk-mb", self.chunk_bytes), ("--max-doc-mb", self.max_doc_bytes)):
            if value < 1:  # a zero chunk size never advanced: memory grew without bound
                raise UserError(f"{flag} must be >= 1, got {value >> 20}")
        check_workers(self.num_workers)


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    """Work done since the last update (deltas), or the totals when `total_bytes` is set."""

    docs: int = 0
    tokens: int = 0
    num_bytes: int = 0
    total_bytes: int = 0
    resumed: bool = False
    """The bytes are chunks finished by an earlier, interrupted run."""


@dataclass(slots=True)
class PreprocessSummary:
    """What a run produced."""

    prefix: str
    num_docs: int
    num_empty_docs: int
    num_tokens: int
    num_bytes: int
    dtype: str
    elapsed_s: float
    num_chunks: int
    num_chunks_resumed: int
    num_workers: int
    problems: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form with rates."""
        out = asdict(self)
        t = max(self.elapsed_s, 1e-9)
        out.update(
            docs_per_s=self.num_docs / t,
            tokens_per_s=self.num_tokens / t,
            mb_per_s=self.num_bytes / t / 1e6,
        )
        return out


# ---------------------------------------------------------------- worker side

_WORKER: dict[str, Any] = {}


def _init_worker(
    spec: TokenizerSpec,
    progress_q: Any,
    work_dir: str,
    cfg: PreprocessConfig,
    in_pool: bool = False,
) -> None:
    if in_pool:
        worker_signals()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = Tokenizer(spec)
    _WORKER.update(tok=tok, q=progress_q, work_dir=Path(work_dir), cfg=cfg)
    _WORKER["dtype"] = indexed.token_dtype(tok.vocab_size)


STREAM_BYTES = 1 << 20
"""Documents larger than this (input bytes) are read as segment streams (see `readers`)."""


def _encode_batch(
    batch: list[Document], tok: Tokenizer, writer: indexed.ShardWriter, append_eod: bool
) -> np.ndarray:
    """Tokenize a batch straight into the shard (ids written one engine call at a time, never
    assembled into one array); return the per-document lengths. Megatron-LM: no EOD for a
    document without tokens."""
    texts: list[Text] = [d.stream or d.text for d in batch]
    lengths = tok.encode_into(texts, writer.add_tokens, append_eod=append_eod, dtype=writer.dtype)
    writer.add_lengths(lengths)
    return lengths


def _batches(docs: Iterator[Document], max_docs: int, max_bytes: int) -> Iterator[list[Document]]:
    """Group documents so that one tokenizer call sees at most max_docs or about max_bytes."""
    batch: list[Document] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += doc.num_bytes
        if len(batch) >= max_docs or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _progress_bytes(chunk: Chunk, nbytes: int, reported: int) -> int:
    """Input bytes of the chunk that `nbytes` of documents stand for, on the progress line.

    The total is the input's size on disk: a compressed file's documents are larger than the
    file (counted when the chunk is done) and a Parquet row group's share is an estimate
    (capped, the rest counted when the chunk is done), so the line never passes 100 %.
    """
    if chunk.compressed:
        return 0
    return min(nbytes, max(chunk.num_bytes - reported, 0))


def _run_chunk(chunk: Chunk) -> dict[str, Any]:
    """Tokenize one chunk into `shard_<index>`; return its counts (also saved as .done)."""
    tok, q, cfg, dtype = _WORKER["tok"], _WORKER["q"], _WORKER["cfg"], _WORKER["dtype"]
    work_dir: Path = _WORKER["work_dir"]
    tmp_prefix = work_dir / f"shard_{chunk.index:06d}.tmp"
    writer = indexed.ShardWriter(tmp_prefix, dtype)
    log = ProblemLog()
    docs = iter_documents(
        chunk,
        text_field=cfg.text_field,
        on_error=cfg.on_error,
        log=log,
        max_doc_bytes=cfg.max_doc_bytes,
        keep_empty=not cfg.drop_empty,
        keep_raw=False,
        stream_bytes=STREAM_BYTES if tok.splittable else 0,
    )
    counts = {"docs": 0, "tokens": 0, "bytes": 0, "empty": 0}
    reported = 0  # input bytes reported to the progress line for this chunk
    for batch in _batches(docs, cfg.batch_docs, cfg.batch_bytes):
        lengths = _encode_batch(batch, tok, writer, cfg.append_eod)
        nbytes, ntokens = sum(d.num_bytes for d in batch), int(lengths.sum(dtype=np.int64))
        counts["docs"] += len(batch)
        counts["empty"] += int(np.count_nonzero(lengths == 0))
        counts["tokens"] += ntokens
        counts["bytes"] += nbytes
        step = _progress_bytes(chunk, nbytes, reported)
        reported += step
        q(ProgressUpdate(len(batch), ntokens, step))
        del batch
    q(ProgressUpdate(num_bytes=max(chunk.num_bytes - reported, 0)))
    writer.close()
    final = work_dir / f"shard_{chunk.index:06d}"
    os.replace(indexed.bin_path(tmp_prefix), indexed.bin_path(final))
    os.replace(indexed.idx_path(tmp_prefix), indexed.idx_path(final))
    result = {"index": chunk.index, **counts, "problems": log.as_dict()}
    write_json_atomic(work_dir / f"shard_{chunk.index:06d}.done.json", result)
    return result


# ---------------------------------------------------------------- parent side


def _fingerprint(
    cfg: PreprocessConfig, scans: list[FileScan], tokenizer_id: dict[str, Any], chunks: list[Chunk]
) -> dict[str, Any]:
    return {
        "inputs": [
            {"path": str(s.path), "num_bytes": s.num_bytes, "sha256": s.sha256} for s in scans
        ],
        "tokenizer": tokenizer_id,
        "text_field": cfg.text_field,
        "append_eod": cfg.append_eod,
        "on_error": str(cfg.on_error),
        "max_doc_bytes": cfg.max_doc_bytes,
        "drop_empty": cfg.drop_empty,
        "chunks": [[c.paths[0], c.start, c.end] for c in chunks],
    }


def _prepare_work_dir(work_dir: Path, plan: dict[str, Any]) -> set[int]:
    """Keep a previous run's finished shards if its plan matches; return their indices."""
    if read_json(work_dir / "plan.json") != plan and work_dir.exists():
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(work_dir / "plan.json", plan)
    done = set()
    for marker in work_dir.glob("shard_*.done.json"):
        index = int(marker.name.split("_")[1].split(".")[0])
        if indexed.idx_path(work_dir / f"shard_{index:06d}").exists():
            done.add(index)
    return done


def _check_vocab(cfg: PreprocessConfig, tok: Tokenizer) -> None:
    if tok.eod >= tok.vocab_size:
        raise UserError(f"tokenizer EOD id {tok.eod} is outside its vocabulary ({tok.vocab_size})")
    if cfg.model_vocab_size is not None and tok.vocab_size > cfg.model_vocab_size:
        raise UserError(
            f"tokenizer {tok.spec.path} has {tok.vocab_size} tokens but the model's vocabulary "
            f"is {cfg.model_vocab_size}"
        )


def _run_chunks(
    cfg: PreprocessConfig,
    spec: TokenizerSpec,
    todo: list[Chunk],
    work_dir: Path,
    num_workers: int,
    report: Callable[[ProgressUpdate], None],
) -> list[dict[str, Any]]:
    if num_workers <= 1 or len(todo) <= 1:
        _init_worker(spec, report, str(work_dir), cfg)
        return [_run_chunk(c) for c in todo]
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q = ctx.Queue()
    results: list[dict[str, Any]] = []
    with ctx.Pool(
        min(num_workers, len(todo)), _init_worker, (spec, q.put, str(work_dir), cfg, True)
    ) as pool:
        pending = [pool.apply_async(_run_chunk, (c,)) for c in todo]
        while pending:
            _drain(q, report, timeout=0.2)
            for r in [p for p in pending if p.ready()]:
                results.append(r.get())
                pending.remove(r)
        _drain(q, report, timeout=0.0)
    return results


def _drain(q: Any, report: Callable[[ProgressUpdate], None], timeout: float) -> None:
    try:
        report(q.get(timeout=timeout) if timeout else q.get_nowait())
        while True:
            report(q.get_nowait())
    except queue.Empty:
        pass


def output_paths(prefix: str | Path) -> list[Path]:
    """The files a preprocess run writes for a prefix."""
    return [indexed.bin_path(prefix), indexed.idx_path(prefix), manifest_path(prefix)]


def preprocess(
    cfg: PreprocessConfig, on_progress: Callable[[ProgressUpdate], None] | None = None
) -> PreprocessSummary:
    """Tokenize `cfg.inputs` into `<cfg.output_prefix>.bin/.idx` with a manifest.

    Existing outputs are refused unless `cfg.force`; one run at a time per prefix (a lock
    beside it). SIGINT and SIGTERM stop the workers and keep finished chunks for a rerun.

    Args:
        cfg: the run's options.
        on_progress: called with the totals first, then with deltas as work is done.

    Raises:
        UserError: bad input under on_error=fail, missing files, a mismatched tokenizer, an
            output that exists or cannot be written, another run on the same prefix.
        Interrupted: stopped by SIGINT (exit code 130) or SIGTERM (143).
    """
    prefix = Path(cfg.output_prefix)
    check_file_targets(output_paths(prefix), cfg.force, f"the dataset {prefix}")
    with OutputLock(prefix):
        return _preprocess_locked(cfg, prefix, on_progress or (lambda _u: None))


@dataclass(slots=True)
class RunPlan:
    """What a run will do: the tokenizer, the chunks and the fingerprint that decides whether
    finished shards from an earlier run can be reused."""

    spec: TokenizerSpec
    tok: Tokenizer
    chunks: list[Chunk]
    plan: dict[str, Any]
    work_dir: Path
    done: set[int]
    command: dict[str, Any] | None = None
    """How the run was started, when not by this process (a SLURM job records the submitter)."""


def plan_run(cfg: PreprocessConfig, prefix: Path, stage: bool = True) -> RunPlan:
    """Load the tokenizer, cut the inputs into chunks, and (`stage`) prepare
    `<prefix>.llmctl-tmp/`; without `stage` nothing is written (see `stage_run`)."""
    spec = resolve_tokenizer(cfg.tokenizer, cfg.tokenizer_kind)
    if cfg.eod_token:
        spec = TokenizerSpec(spec.path, spec.kind, cfg.eod_token)
    tok = Tokenizer(spec)
    _check_vocab(cfg, tok)
    chunks, scans = plan_chunks(discover(list(cfg.inputs)), cfg.chunk_bytes)
    tokenizer_id = {**spec.identity(), "vocab_size": tok.vocab_size, "eod": tok.eod}
    plan = _fingerprint(cfg, scans, tokenizer_id, chunks)
    work_dir = prefix.with_name(prefix.name + ".llmctl-tmp")
    run = RunPlan(spec, tok, chunks, plan, work_dir, set())
    return stage_run(run, prefix) if stage else run


def stage_run(run: RunPlan, prefix: Path) -> RunPlan:
    """Create `run.work_dir` (keeping an earlier run's finished shards if its plan matches)."""
    make_parent(prefix)
    run.done = _prepare_work_dir(run.work_dir, run.plan)
    return run


def run_chunk_here(cfg: PreprocessConfig, run: RunPlan, index: int) -> dict[str, Any]:
    """Tokenize one chunk in this process (a SLURM array task); skip it if already done."""
    marker = run.work_dir / f"shard_{index:06d}.done.json"
    if (done := read_json(marker)) is not None:
        return {**done, "skipped": True}
    _init_worker(run.spec, lambda _u: None, str(run.work_dir), cfg)
    return _run_chunk(run.chunks[index])


def finish_run(
    cfg: PreprocessConfig,
    prefix: Path,
    run: RunPlan,
    started: float,
    num_workers: int,
    keep_logs: bool = False,
) -> PreprocessSummary:
    """Merge the finished shards in chunk order and commit `.bin`, `.idx`, manifest.

    The work folder is removed afterwards; with `keep_logs` (SLURM) only the shards go and the
    job's scripts and logs stay.

    Raises:
        UserError: a chunk is not done, or no documents at all.
    """
    missing = [c.index for c in run.chunks if not _shard_done(run.work_dir, c.index)]
    if missing:
        raise UserError(f"chunks {missing[:10]} of {prefix} are not done; rerun them first")
    results = [read_json(run.work_dir / f"shard_{c.index:06d}.done.json") or {} for c in run.chunks]
    summary = _summarize(
        cfg, results, run.tok, started, len(run.chunks), len(run.done), num_workers
    )
    if summary.num_docs == 0:
        if not keep_logs:  # nothing to resume from; a SLURM job's logs stay
            shutil.rmtree(run.work_dir, ignore_errors=True)
        raise UserError(f"no documents in {', '.join(cfg.inputs)} (problems: {summary.problems})")
    _commit(cfg, prefix, run, summary, keep_logs)
    summary.elapsed_s = time.perf_counter() - started
    return summary


def _shard_done(work_dir: Path, index: int) -> bool:
    marker = work_dir / f"shard_{index:06d}.done.json"
    return marker.exists() and indexed.idx_path(work_dir / f"shard_{index:06d}").exists()


def _preprocess_locked(
    cfg: PreprocessConfig, prefix: Path, report: Callable[[ProgressUpdate], None]
) -> PreprocessSummary:
    started = time.perf_counter()
    run = plan_run(cfg, prefix)
    chunks, work_dir = run.chunks, run.work_dir
    report(ProgressUpdate(total_bytes=sum(c.num_bytes for c in chunks)))
    resumed = sum(c.num_bytes for c in chunks if c.index in run.done)
    report(ProgressUpdate(num_bytes=resumed, resumed=True))
    num_workers = resolve_workers(cfg.num_workers)
    todo = [c for c in chunks if c.index not in run.done]
    try:
        with interruptible():
            _run_chunks(cfg, run.spec, todo, work_dir, num_workers, report)
    except BadInputError as e:
        # The input has to change before a rerun, and then no chunk's work is reused.
        shutil.rmtree(work_dir, ignore_errors=True)
        raise UserError(f"{e}; use --on-error skip to skip and count such documents") from None
    except BaseException as e:
        if (code := stop_code(e)) is None:
            raise
        kept = len(list(work_dir.glob("shard_*.done.json")))
        raise Interrupted(
            f"interrupted: {kept} of {len(chunks)} chunks done and kept in {work_dir}; "
            f"run the same command again to resume",
            code,
        ) from None
    return finish_run(cfg, prefix, run, started, num_workers)


def _summarize(
    cfg: PreprocessConfig,
    results: list[dict[str, Any]],
    tok: Tokenizer,
    started: float,
    num_chunks: int,
    num_resumed: int,
    num_workers: int,
) -> PreprocessSummary:
    log = ProblemLog()
    for r in results:
        part = ProblemLog()
        part.counts.update(r["problems"]["counts"])
        part.examples.extend(r["problems"]["examples"])
        log.merge(part)
    return PreprocessSummary(
        prefix=cfg.output_prefix,
        num_docs=sum(r["docs"] for r in results),
        num_empty_docs=sum(r.get("empty", 0) for r in results),
        num_tokens=sum(r["tokens"] for r in results),
        num_bytes=sum(r["bytes"] for r in results),
        dtype=np.dtype(indexed.token_dtype(tok.vocab_size)).name,
        elapsed_s=time.perf_counter() - started,
        num_chunks=num_chunks,
        num_chunks_resumed=num_resumed,
        num_workers=num_workers,
        problems=log.as_dict(),
    )


def _upstream(inputs: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, Any]:
    """The dedup run that wrote these inputs, and the clean run before it (or before these
    inputs directly): (dedup record, clean record), each None when there was none."""
    paths = [str(e["path"]) for e in inputs]
    dedup = upstream_report(paths, "dedup_report.json")
    if dedup is not None:
        report = read_json(Path(dedup["report"])) or {}
        return dedup, report.get("clean")
    return None, upstream_report(paths, "clean_report.json")


def _commit(
    cfg: PreprocessConfig,
    prefix: Path,
    run: RunPlan,
    summary: PreprocessSummary,
    keep_logs: bool = False,
) -> None:
    work_dir, chunks, plan = run.work_dir, run.chunks, run.plan
    shards = [work_dir / f"shard_{c.index:06d}" for c in chunks]
    merged = work_dir / "merged"
    if len(shards) == 1:
        merged = shards[0]
    else:
        indexed.merge_shards(shards, merged, indexed.token_dtype(plan["tokenizer"]["vocab_size"]))
    dedup_record, clean_record = _upstream(plan["inputs"])
    manifest = {
        **stamp(),
        "kind": "megatron-indexed-dataset",
        "prefix": prefix.name,
        "dtype": summary.dtype,
        "inputs": plan["inputs"],
        "tokenizer": plan["tokenizer"],
        "text_field": cfg.text_field,
        "append_eod": cfg.append_eod,
        "counts": {
            "documents": summary.num_docs,
            "empty_documents": summary.num_empty_docs,
            "tokens": summary.num_tokens,
            "input_bytes": summary.num_bytes,
            "skipped": summary.problems["counts"],
        },
        "problem_examples": summary.problems["examples"],
        "dedup": cfg.dedup or dedup_record,
        "clean": clean_record,
        "drop_empty": cfg.drop_empty,
        "command": run.command or command_line(),
    }
    write_json_atomic(work_dir / "manifest.json", manifest)
    moves = [
        (indexed.bin_path(merged), indexed.bin_path(prefix)),
        (indexed.idx_path(merged), indexed.idx_path(prefix)),
    ]
    commit(moves, work_dir / "manifest.json", manifest_path(prefix))
    if not keep_logs:
        shutil.rmtree(work_dir)
        return
    for f in [*work_dir.glob("shard_*"), *work_dir.glob("merged*"), work_dir / "plan.json"]:
        f.unlink(missing_ok=True)
