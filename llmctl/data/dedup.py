"""`llmctl data dedup`: exact and fuzzy (MinHash + LSH) deduplication, streaming by chunk.

Three steps, each a function the SLURM path also runs as its own job:

1. `signature_shard` (per chunk, in parallel): read the chunk's documents (the only time
   they are parsed), hash each normalised text (xxh3-128) for exact dedup, compute MinHash
   signatures and LSH band keys, save them as one `.arrays` file per chunk, and with exact
   verification the shingle hashes as `.shingles.npy`. Memory: one chunk.
2. `cluster` (once): exact duplicates and LSH buckets give candidate edges; candidates are
   verified (`none`, `signature`: estimated Jaccard, `exact`: true Jaccard of the shingle
   sets step 1 kept, memory-mapped) and joined into connected components; the smallest
   document id of each component is kept.
3. `write_kept` (unless `--dry-run`): copy the kept records, in the input's format, to the
   output folder under a temporary name (JSONL lines by line number, unparsed), then rename
   it into place with the report.

Defaults (see docs/data.md for the comparison): word 5-grams as in datatrove and text-dedup;
threshold 0.8 as in NeMo Curator; 20 bands x 6 rows = 120 permutations, which puts the LSH
S-curve at (1/20)**(1/6) = 0.61 so that a pair at Jaccard 0.8 is a candidate with probability
0.998 (0.9999 at 0.85), and exact verification removes the extra candidates below 0.8.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.data.choices import DedupMode as DedupMode
from llmctl.data.choices import Verify as Verify
from llmctl.data.manifest import read_json, stamp, upstream_report, write_json_atomic
from llmctl.data.minhash import (
    SIGNATURE_SCHEME,
    MinHasher,
    Normalization,
    ShingleUnit,
    band_keys,
    candidate_probability,
    fmix64,
    hash_documents,
    normalized_digests,
    shingle_hashes,
)
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
    OnError,
    ProblemLog,
    TruncatedError,
    compressed_lines,
    discover,
    iter_documents,
    plan_chunks,
)
from llmctl.data.shinglesets import ShingleSets, sorted_unique
from llmctl.data.unionfind import components
from llmctl.errors import UserError
from llmctl.staging import check_collisions, check_dir_target, commit_dir

REPORT_NAME = "dedup_report.json"


@dataclass(kw_only=True)
class DedupConfig:
    """Options of one dedup run."""

    inputs: list[str]
    """Input files or folders (JSONL, Parquet, text)."""
    output_dir: str | None = None
    """Folder for the kept documents and the report; not needed with dry_run."""
    mode: DedupMode = DedupMode.BOTH
    """exact, fuzzy, or both."""
    text_field: str = "text"
    """JSONL key or Parquet column holding the text."""
    ngram: int = 5
    """Shingle size, in words or characters."""
    unit: ShingleUnit = ShingleUnit.WORD
    """Shingles made of words or characters (UTF-8 bytes)."""
    bands: int = 20
    """LSH bands."""
    rows: int = 6
    """Signature rows per band; num_perm = bands * rows."""
    threshold: float = 0.8
    """Jaccard similarity at or above which two documents are duplicates."""
    verify: Verify = Verify.EXACT
    """Check candidate pairs: none, signature (estimated Jaccard) or exact (true Jaccard)."""
    seed: int = 1
    """Seed of the MinHash permutations."""
    lowercase: bool = True
    """Normalisation: lowercase."""
    strip_punctuation: bool = True
    """Normalisation: ASCII punctuation to spaces."""
    collapse_whitespace: bool = True
    """Normalisation: whitespace runs to one space."""
    nfkc: bool = False
    """Normalisation: Unicode NFKC first."""
    on_error: OnError = OnError.FAIL
    """Bad input policy, as for preprocess."""
    num_workers: int = 0
    """Worker processes for signatures; 0 means one per CPU core."""
    chunk_bytes: int = 32 << 20
    """Input bytes per work unit."""
    dry_run: bool = False
    """Report only; write nothing."""
    num_examples: int = 10
    """Clusters shown in the report."""
    precision_sample: int = 500
    """Removed documents checked against their kept document to estimate precision."""
    force: bool = False
    """Replace llmctl's earlier outputs in a non-empty output folder (other files are kept)."""

    def __post_init__(self) -> None:
        try:
            self.mode = DedupMode(self.mode)
            self.unit = ShingleUnit(self.unit)
            self.verify = Verify(self.verify)
            self.on_error = OnError(self.on_error)
        except ValueError as e:
            raise UserError(f"dedup: {e}") from None

    @property
    def num_perm(self) -> int:
        """Signature length."""
        return self.bands * self.rows

    def normalization(self) -> Normalization:
        """The text normalisation these options describe."""
        return Normalization(
            self.lowercase, self.strip_punctuation, self.collapse_whitespace, self.nfkc
        )

    def params(self) -> dict[str, Any]:
        """The parameters that decide the result (for manifests, the report and the work
        folder's plan, so that signatures of another scheme are never resumed)."""
        out = {k: v for k, v in asdict(self).items() if k not in _RUN_ONLY}
        out["signature_scheme"] = SIGNATURE_SCHEME
        return {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in out.items()}

    def validate(self) -> None:
        """Raises UserError for impossible settings."""
        if not 0.0 < self.threshold <= 1.0:
            raise UserError(f"threshold {self.threshold} must be in (0, 1]")
        if self.bands < 1 or self.rows < 1 or self.ngram < 1:
            raise UserError(
                f"bands={self.bands}, rows={self.rows}, ngram={self.ngram} must be >= 1"
            )
        check_workers(self.num_workers)
        if self.output_dir is None and not self.dry_run:
            raise UserError("dedup needs an output folder (--out DIR, or --dry-run)")
        if self.output_dir is not None and not self.dry_run:
            check_dir_target(Path(self.output_dir), self.force, "dedup")


_RUN_ONLY = {
    "inputs",
    "output_dir",
    "num_workers",
    "dry_run",
    "num_examples",
    "on_error",
    "chunk_bytes",
    "force",
}


# ---------------------------------------------------------------- step 1: signatures


def signature_shard(chunk: Chunk, cfg: DedupConfig, work_dir: Path) -> dict[str, Any]:
    """Hash one chunk's documents into `sig_<index>.arrays`; return its counts.

    The chunk is read once: exact hashes, MinHash signatures, LSH keys and (with exact
    verification) the shingle hashes, kept in `sig_<index>.shingles.npy` so that verification
    never reads or hashes the input again.
    """
    log = ProblemLog()
    docs = list(
        iter_documents(chunk, text_field=cfg.text_field, on_error=OnError(cfg.on_error), log=log)
    )
    where = {p: i for i, p in enumerate(chunk.paths)}
    texts = [d.text for d in docs]
    arrays: dict[str, np.ndarray] = {
        "exact": exact_hashes(texts, cfg.normalization()),
        "lines": np.array([d.line for d in docs], dtype=np.int64),
        "path_idx": np.array([where[d.path] for d in docs], dtype=np.int32),
    }
    del docs
    if cfg.mode is not DedupMode.EXACT:
        keep = cfg.verify is Verify.EXACT
        hashed = hash_documents(
            texts, MinHasher(cfg.num_perm, cfg.seed), ngram=cfg.ngram, unit=cfg.unit,
            norm=cfg.normalization(), keep_shingles=keep,
        )  # fmt: skip
        arrays["keys"] = band_keys(hashed.signatures, cfg.bands, cfg.rows)
        if cfg.verify is Verify.SIGNATURE:
            arrays["sig"] = hashed.signatures
        if hashed.shingles is not None and hashed.offsets is not None:
            arrays["sh_off"] = hashed.offsets
            _save_npy(work_dir / f"sig_{chunk.index:06d}.shingles.npy", hashed.shingles)
    _save_arrays(work_dir / f"sig_{chunk.index:06d}.arrays", arrays)
    result: dict[str, Any] = {"index": chunk.index, "docs": len(texts), "bytes": chunk.num_bytes}
    result["problems"] = log.as_dict()
    write_json_atomic(work_dir / f"sig_{chunk.index:06d}.done.json", result)
    return result


def exact_hashes(texts: list[str], norm: Normalization) -> np.ndarray:
    """(len(texts), 2) uint64: xxh3-128 of each normalised text."""
    return normalized_digests(texts, norm)


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Named arrays as consecutive `.npy` records, the names first (like `.npz`, without
    zipfile's import and archive), written under a temporary name and renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.array(list(arrays)))
        for a in arrays.values():
            np.save(f, a)
    os.replace(tmp, path)


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        names = np.load(f).tolist()
        return {name: np.load(f) for name in names}


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


_STATE: dict[str, Any] = {}


def _init(cfg: DedupConfig, work_dir: str) -> None:
    worker_signals()
    _STATE.update(cfg=cfg, work_dir=Path(work_dir))


def _task(chunk: Chunk) -> dict[str, Any]:
    return signature_shard(chunk, _STATE["cfg"], _STATE["work_dir"])


def run_signatures(
    cfg: DedupConfig,
    chunks: list[Chunk],
    work_dir: Path,
    on_progress: Callable[[int, int], None],
) -> None:
    """Step 1 on this machine, skipping chunks already done; progress as (docs, bytes)."""
    todo = [c for c in chunks if not (work_dir / f"sig_{c.index:06d}.done.json").exists()]
    num_workers = min(resolve_workers(cfg.num_workers), max(len(todo), 1))
    if num_workers <= 1:
        for c in todo:
            r = signature_shard(c, cfg, work_dir)
            on_progress(r["docs"], r["bytes"])
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(num_workers, _init, (cfg, str(work_dir))) as pool:
        for r in pool.imap_unordered(_task, todo):
            on_progress(r["docs"], r["bytes"])


# ---------------------------------------------------------------- step 2: clusters


@dataclass(slots=True)
class Shards:
    """Step 1's outputs, concatenated in document order."""

    chunks: list[Chunk]
    doc_offsets: np.ndarray
    exact: np.ndarray
    lines: np.ndarray
    path_idx: np.ndarray
    keys: np.ndarray | None
    sig: np.ndarray | None
    problems: ProblemLog = field(default_factory=ProblemLog)
    shingles: list[np.ndarray] | None = None
    sh_off: list[np.ndarray] | None = None

    @property
    def num_docs(self) -> int:
        """Documents read."""
        return int(self.doc_offsets[-1])

    def location(self, doc: int) -> str:
        """`path:line` of a document."""
        c = int(np.searchsorted(self.doc_offsets, doc, side="right")) - 1
        return f"{self.chunks[c].paths[int(self.path_idx[doc])]}:{self.lines[doc]}"

    def chunk_of(self, doc: int) -> int:
        """Index of the chunk holding a document."""
        return int(np.searchsorted(self.doc_offsets, doc, side="right")) - 1


def load_shards(chunks: list[Chunk], work_dir: Path) -> Shards:
    """Read every chunk's arrays (the step 1 outputs)."""
    parts = [_load_arrays(work_dir / f"sig_{c.index:06d}.arrays") for c in chunks]
    counts = [len(p["lines"]) for p in parts]
    log = ProblemLog()
    for c in chunks:
        done = read_json(work_dir / f"sig_{c.index:06d}.done.json") or {}
        part = ProblemLog()
        part.counts.update(done.get("problems", {}).get("counts", {}))
        part.examples.extend(done.get("problems", {}).get("examples", []))
        log.merge(part)

    def cat(name: str) -> np.ndarray | None:
        if name not in parts[0]:
            return None
        return np.concatenate([p[name] for p in parts])

    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    exact, lines, path_idx = cat("exact"), cat("lines"), cat("path_idx")
    assert exact is not None and lines is not None and path_idx is not None
    shards = Shards(chunks, offsets, exact, lines, path_idx, cat("keys"), cat("sig"), log)
    if parts and "sh_off" in parts[0]:
        shards.sh_off = [p["sh_off"] for p in parts]
        shards.shingles = [
            np.load(work_dir / f"sig_{c.index:06d}.shingles.npy", mmap_mode="r") for c in chunks
        ]
    return shards


def exact_edges(exact: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (first occurrence, later copy) for identical normalised texts."""
    if not len(exact):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((exact[:, 1], exact[:, 0]))  # stable: equal rows by position
    rows = exact[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    first = order[np.maximum.accumulate(np.where(new, np.arange(len(rows)), 0))]
    rep = np.empty(len(exact), dtype=np.int64)
    rep[order] = first
    dup = np.flatnonzero(rep != np.arange(len(exact)))
    return rep[dup], dup.astype(np.int64)


def lsh_edges(keys: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate edges: in every band, each bucket's members linked to its first member."""
    docs = np.flatnonzero(active)
    src_parts, dst_parts = [], []
    for b in range(keys.shape[1]):
        k = keys[docs, b]
        order = np.argsort(k, kind="stable")
        ks, ds = k[order], docs[order]
        new_run = np.concatenate([[True], ks[1:] != ks[:-1]])
        run_first = ds[np.maximum.accumulate(np.where(new_run, np.arange(len(ds)), 0))]
        member = ~new_run
        src_parts.append(run_first[member])
        dst_parts.append(ds[member])
    if not src_parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    src, dst = np.concatenate(src_parts), np.concatenate(dst_parts)
    n = np.int64(len(keys))
    pairs = sorted_unique(np.minimum(src, dst) * n + np.maximum(src, dst))
    return pairs // n, pairs % n


def shingle_sets(shards: Shards, cfg: DedupConfig, wanted: np.ndarray) -> ShingleSets:
    """The shingle sets of the `wanted` documents (sorted distinct ids): from step 1's files
    when it kept them (exact verification), else by reading and hashing those documents again."""
    if shards.shingles is None or shards.sh_off is None:
        return _rehash(shards, cfg, wanted)
    chunk = np.searchsorted(shards.doc_offsets, wanted, side="right") - 1
    parts = [ShingleSets.build(wanted[:0], np.zeros(0, np.uint32), np.zeros(0, np.int64))]
    for c in sorted_unique(chunk).tolist():
        local = wanted[chunk == c] - shards.doc_offsets[c]
        parts.append(ShingleSets.from_runs(local, shards.shingles[c], shards.sh_off[c]))
    lengths = np.concatenate([np.diff(p.offsets) for p in parts])
    hashes = np.concatenate([p.values for p in parts])
    return ShingleSets(wanted, hashes, np.concatenate([[0], np.cumsum(lengths)]))


def _chunk_texts(shards: Shards, cfg: DedupConfig, wanted: np.ndarray) -> dict[int, str]:
    """Texts of the `wanted` documents, read again from the chunks holding them."""
    wanted_set = set(int(w) for w in wanted)
    out: dict[int, str] = {}
    for ci, chunk in enumerate(shards.chunks):
        lo, hi = int(shards.doc_offsets[ci]), int(shards.doc_offsets[ci + 1])
        local = {w - lo for w in wanted_set if lo <= w < hi}
        if not local:
            continue
        docs = iter_documents(
            chunk, text_field=cfg.text_field, on_error=OnError.SKIP, log=ProblemLog()
        )
        out.update({lo + i: d.text for i, d in enumerate(docs) if i in local})
    return out


def _rehash(shards: Shards, cfg: DedupConfig, wanted: np.ndarray) -> ShingleSets:
    texts = _chunk_texts(shards, cfg, wanted)
    ids = sorted(texts)
    hashes, lengths = [np.zeros(0, np.uint32)], [np.zeros(0, np.int64)]
    for start in range(0, len(ids), 128):
        batch = ids[start : start + 128]
        h, off = shingle_hashes([texts[i] for i in batch], cfg.ngram, cfg.unit, cfg.normalization())
        hashes.append(h)
        lengths.append(np.diff(off))
    docs = np.array(ids, dtype=np.int64)
    return ShingleSets.build(docs, np.concatenate(hashes), np.concatenate(lengths))


def raw_lines(chunk: Chunk) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a JSONL chunk's lines, unparsed, numbered as the reader does.

    A truncated archive ends the lines quietly: step 1 already reported it.
    """
    number = chunk.line_base
    try:
        if chunk.compressed:
            for raw in compressed_lines(chunk.paths[0]):
                number += 1
                yield number, raw
            return
        with open(chunk.paths[0], "rb") as f:
            f.seek(chunk.start)
            pos = chunk.start
            for raw in f:
                if 0 <= chunk.end <= pos:
                    break
                pos += len(raw)
                number += 1
                yield number, raw
    except TruncatedError:
        return


def snippets(shards: Shards, cfg: DedupConfig, wanted: np.ndarray) -> dict[int, str]:
    """The first 160 characters of the `wanted` documents (JSONL: only their lines parsed)."""
    by_chunk: dict[int, dict[int, int]] = {}
    for doc in (int(w) for w in wanted):
        by_chunk.setdefault(shards.chunk_of(doc), {})[int(shards.lines[doc])] = doc
    out: dict[int, str] = {}
    others: list[int] = []
    for c, want in by_chunk.items():
        if shards.chunks[c].kind is not InputKind.JSONL:
            others.extend(want.values())
            continue
        last = max(want)
        for number, raw in raw_lines(shards.chunks[c]):
            if number in want:
                out[want[number]] = str(json.loads(raw)[cfg.text_field])[:160]
            if number >= last:
                break
    texts = _chunk_texts(shards, cfg, np.array(others, dtype=np.int64)) if others else {}
    out.update({d: t[:160] for d, t in texts.items()})
    return out


def verify_edges(
    shards: Shards, cfg: DedupConfig, src: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray, ShingleSets | None]:
    """Keep the candidate edges whose similarity reaches the threshold."""
    if cfg.verify is Verify.NONE or not len(src):
        return src, dst, None
    if cfg.verify is Verify.SIGNATURE:
        assert shards.sig is not None
        est = np.mean(shards.sig[src] == shards.sig[dst], axis=1)
        keep = est >= cfg.threshold
        return src[keep], dst[keep], None
    docs = shingle_sets(shards, cfg, sorted_unique(np.concatenate([src, dst])))
    keep = docs.jaccard(src, dst) >= cfg.threshold
    return src[keep], dst[keep], docs


@dataclass(slots=True)
class Clusters:
    """The outcome: which documents are kept."""

    labels: np.ndarray
    exact_dups: np.ndarray
    num_candidates: int
    num_verified: int

    @property
    def keep(self) -> np.ndarray:
        """Boolean mask of kept documents."""
        mask: np.ndarray = self.labels == np.arange(len(self.labels))
        return mask


def cluster(shards: Shards, cfg: DedupConfig) -> tuple[Clusters, ShingleSets | None]:
    """Step 2: exact groups plus verified LSH candidates, joined into components."""
    n = shards.num_docs
    es, ed = exact_edges(shards.exact)
    if cfg.mode is DedupMode.FUZZY:
        es, ed = es[:0], ed[:0]
    docs: ShingleSets | None = None
    fs, fd = np.zeros(0, np.int64), np.zeros(0, np.int64)
    num_candidates = 0
    if cfg.mode is not DedupMode.EXACT and shards.keys is not None:
        active = np.ones(n, dtype=bool)
        active[ed] = False
        cs, cd = lsh_edges(shards.keys, active)
        num_candidates = len(cs)
        fs, fd, docs = verify_edges(shards, cfg, cs, cd)
    labels = components(n, np.concatenate([es, fs]), np.concatenate([ed, fd]))
    return Clusters(labels, ed, num_candidates, len(fs)), docs


# ---------------------------------------------------------------- report


def _wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = (
        z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    )
    return (max(0.0, centre - half), min(1.0, centre + half))


def seeded_sample(ids: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Up to `size` of `ids` (distinct non-negative ints), uniformly without replacement: the
    ones whose seeded murmur3 mix is smallest (a bijection, so a random order of the ids);
    avoids importing numpy.random (~15 ms of start-up)."""
    if len(ids) <= size:
        return ids
    with np.errstate(over="ignore"):
        mixed = fmix64(ids.astype(np.uint64) ^ fmix64(np.array([seed], dtype=np.uint64)))
    return ids[np.sort(np.argpartition(mixed, size)[:size])]


def estimate_precision(
    shards: Shards, cfg: DedupConfig, clusters: Clusters, docs: ShingleSets | None
) -> dict[str, Any]:
    """Share of fuzzily removed documents whose true Jaccard with the kept one >= threshold."""
    fuzzy_mask = ~clusters.keep
    fuzzy_mask[clusters.exact_dups] = False
    fuzzy = np.flatnonzero(fuzzy_mask)
    sample = seeded_sample(fuzzy, cfg.precision_sample, cfg.seed)
    need = sorted_unique(np.concatenate([sample, clusters.labels[sample]]))
    if docs is None or not docs.covers(need):
        docs = shingle_sets(shards, cfg, need)
    sims = docs.jaccard(sample, clusters.labels[sample]).tolist() if len(sample) else []
    hits = sum(s >= cfg.threshold for s in sims)
    low, high = _wilson(hits, len(sims))
    return {
        "num_checked": len(sims),
        "precision": hits / len(sims) if sims else None,
        "ci95": [low, high],
        "min_jaccard": min(sims) if sims else None,
    }


def _counts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values, ascending, and how often each occurs (np.unique's counts, sorting)."""
    s = np.sort(x)
    if not len(s):
        return s, np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    return s[starts], np.diff(starts, append=len(s))


def _examples(shards: Shards, cfg: DedupConfig, clusters: Clusters) -> list[dict[str, Any]]:
    labels = clusters.labels
    reps, sizes = _counts(labels[~clusters.keep])
    top = reps[np.argsort(-sizes, kind="stable")][: cfg.num_examples]
    text = snippets(shards, cfg, top)
    out = []
    for r in top:
        members = np.flatnonzero(labels == r)
        out.append(
            {
                "size": len(members),
                "kept": shards.location(int(r)),
                "removed": [shards.location(int(m)) for m in members[1:6]],
                "snippet": text[int(r)][:120],
            }
        )
    return out


@dataclass(slots=True)
class DedupReport:
    """What a dedup run found (and wrote)."""

    num_docs: int
    num_kept: int
    num_exact_removed: int
    num_fuzzy_removed: int
    num_clusters: int
    largest_cluster: int
    num_candidates: int
    num_verified: int
    precision: dict[str, Any]
    examples: list[dict[str, Any]]
    params: dict[str, Any]
    problems: dict[str, Any]
    output_dir: str | None
    elapsed_s: float
    lsh_candidate_probability: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**stamp(), **asdict(self)}


def build_report(
    shards: Shards,
    cfg: DedupConfig,
    clusters: Clusters,
    docs: ShingleSets | None,
    started: float,
) -> DedupReport:
    """Counts, examples and the precision estimate."""
    keep = clusters.keep
    removed = int((~keep).sum())
    num_exact = len(clusters.exact_dups) if cfg.mode is not DedupMode.FUZZY else 0
    _, sizes = _counts(clusters.labels[~keep])
    precision: dict[str, Any] = {"num_checked": 0, "precision": None}
    if cfg.mode is not DedupMode.EXACT:
        precision = estimate_precision(shards, cfg, clusters, docs)
    curve = {
        f"{s:.2f}": round(candidate_probability(s, cfg.bands, cfg.rows), 4)
        for s in (0.5, 0.6, 0.7, cfg.threshold, 0.9)
    }
    return DedupReport(
        num_docs=shards.num_docs,
        num_kept=int(keep.sum()),
        num_exact_removed=num_exact,
        num_fuzzy_removed=removed - num_exact,
        num_clusters=len(sizes),
        largest_cluster=int(sizes.max()) + 1 if len(sizes) else 0,
        num_candidates=clusters.num_candidates,
        num_verified=clusters.num_verified,
        precision=precision,
        examples=_examples(shards, cfg, clusters),
        params=cfg.params(),
        problems=shards.problems.as_dict(),
        output_dir=None if cfg.dry_run else cfg.output_dir,
        elapsed_s=time.perf_counter() - started,
        lsh_candidate_probability=curve,
    )


# ---------------------------------------------------------------- step 3: output


def _output_name(path: str, root: Path) -> Path:
    p = Path(path)
    try:
        return p.relative_to(root)
    except ValueError:
        return Path(p.name)


def _common_root(chunks: list[Chunk]) -> Path:
    paths = [Path(p).resolve() for c in chunks for p in c.paths]
    return Path(os.path.commonpath([p.parent for p in paths])) if paths else Path(".")


def output_names(chunks: list[Chunk]) -> list[str]:
    """The files `write_kept` may write, relative to the output folder, and the report."""
    root = _common_root(chunks)
    names = {str(_output_name(str(Path(p).resolve()), root)) for c in chunks for p in c.paths}
    return sorted(names | {REPORT_NAME})


def write_kept(shards: Shards, cfg: DedupConfig, keep: np.ndarray, out_tmp: Path) -> None:
    """Copy the kept records, file by file, in their input format (JSONL lines as they are,
    found by line number without parsing them again)."""
    from llmctl.data.writers import RecordWriter

    root = _common_root(shards.chunks)
    writers: dict[str, RecordWriter] = {}

    def writer(path: str, kind: InputKind) -> RecordWriter:
        if path not in writers:
            target = out_tmp / _output_name(str(Path(path).resolve()), root)
            writers[path] = RecordWriter(target, kind, cfg.text_field)
        return writers[path]

    try:
        for ci, chunk in enumerate(shards.chunks):
            lo, hi = int(shards.doc_offsets[ci]), int(shards.doc_offsets[ci + 1])
            if chunk.kind is InputKind.JSONL:
                _copy_lines(chunk, shards.lines[lo:hi][keep[lo:hi]], writer)
                continue
            docs = iter_documents(
                chunk, text_field=cfg.text_field, on_error=OnError.SKIP, log=ProblemLog()
            )
            for i, doc in enumerate(docs):
                if keep[lo + i]:
                    writer(doc.path, chunk.kind).write(doc)
    finally:
        for w in writers.values():
            w.close()


def _copy_lines(chunk: Chunk, kept_lines: np.ndarray, writer: Callable[..., Any]) -> None:
    """Write the lines of a JSONL chunk whose numbers are in `kept_lines` (sorted)."""
    if not len(kept_lines):
        return
    path, wanted, last = chunk.paths[0], set(kept_lines.tolist()), int(kept_lines[-1])
    out = writer(path, chunk.kind)
    for number, raw in raw_lines(chunk):
        if number in wanted:
            out.write(Document("", path, number, len(raw), raw))
        if number >= last:
            break


# ---------------------------------------------------------------- driver


def plan(cfg: DedupConfig) -> tuple[list[Chunk], list[Any]]:
    """Find inputs and cut them into chunks (also hashes them for the manifest)."""
    return plan_chunks(discover(list(cfg.inputs)), cfg.chunk_bytes)


def work_dir_for(cfg: DedupConfig) -> Path:
    """Where signatures live while a run is in progress."""
    if cfg.output_dir is not None:
        out = Path(cfg.output_dir).resolve()
        return out.with_name(out.name + ".llmctl-tmp")
    import hashlib

    key = hashlib.sha256(repr((sorted(cfg.inputs), cfg.params())).encode()).hexdigest()[:16]
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"llmctl-dedup-{key}"


def prepare_work_dir(cfg: DedupConfig, chunks: list[Chunk], scans: list[Any]) -> Path:
    """Create the work folder, discarding one made for other inputs or parameters."""
    work_dir = work_dir_for(cfg)
    fingerprint = {
        "params": cfg.params(),
        "inputs": [[str(s.path), s.sha256] for s in scans],
        "chunks": [[list(c.paths), c.start, c.end] for c in chunks],
    }
    return fresh_work_dir(work_dir, fingerprint)


def finish(
    cfg: DedupConfig,
    chunks: list[Chunk],
    scans: list[Any],
    work_dir: Path,
    started: float,
    keep_logs: bool = False,
) -> DedupReport:
    """Steps 2 and 3 from finished signatures: cluster, report, write, commit.

    The work folder is removed at the end; with `keep_logs` (SLURM) only the signature files
    go, and the job's scripts and logs stay.
    """
    shards = load_shards(chunks, work_dir)
    if shards.num_docs == 0:
        _clean(work_dir, keep_logs)
        problems = shards.problems.as_dict()["counts"]
        raise UserError(f"no documents in {', '.join(cfg.inputs)} (skipped: {problems or 'none'})")
    clusters, docs = cluster(shards, cfg)
    report = build_report(shards, cfg, clusters, docs, started)
    if cfg.dry_run:
        _clean(work_dir, keep_logs)
        return report
    assert cfg.output_dir is not None
    out = Path(cfg.output_dir)
    out_tmp = work_dir / "out"
    shutil.rmtree(out_tmp, ignore_errors=True)
    out_tmp.mkdir()
    write_kept(shards, cfg, clusters.keep, out_tmp)
    payload = report.as_dict()
    payload["inputs"] = [{"path": str(s.path), "sha256": s.sha256} for s in scans]
    payload["command"] = command_line()
    payload["clean"] = upstream_report([str(s.path) for s in scans], "clean_report.json")
    write_json_atomic(out_tmp / REPORT_NAME, payload)
    commit_dir(out_tmp, out, "dedup", metadata=(REPORT_NAME,))
    _clean(work_dir, keep_logs)
    return report


def _clean(work_dir: Path, keep_logs: bool) -> None:
    if not keep_logs:
        shutil.rmtree(work_dir)
        return
    for f in work_dir.glob("sig_*"):
        f.unlink()


def dedup(
    cfg: DedupConfig, on_progress: Callable[[int, int, int], None] | None = None
) -> DedupReport:
    """Deduplicate `cfg.inputs` on this machine.

    Args:
        cfg: the run's options.
        on_progress: called with (total bytes, docs done, bytes done) as chunks finish.

    Raises:
        UserError: bad options, or bad input under on_error=fail.
    """
    cfg.validate()
    if cfg.output_dir is None or cfg.dry_run:
        return _dedup_here(cfg, on_progress)
    with OutputLock(Path(cfg.output_dir)):
        return _dedup_here(cfg, on_progress)


def _dedup_here(
    cfg: DedupConfig, on_progress: Callable[[int, int, int], None] | None
) -> DedupReport:
    started = time.perf_counter()
    chunks, scans = plan(cfg)
    if cfg.output_dir is not None and not cfg.dry_run:
        check_collisions(Path(cfg.output_dir), output_names(chunks))
    work_dir = prepare_work_dir(cfg, chunks, scans)
    total = sum(c.num_bytes for c in chunks)
    report = on_progress or (lambda _t, _d, _b: None)
    report(total, 0, 0)
    try:
        with interruptible():
            run_signatures(cfg, chunks, work_dir, lambda d, b: report(total, d, b))
    except BadInputError as e:
        # The input has to change before a rerun, and then no chunk's work is reused.
        shutil.rmtree(work_dir, ignore_errors=True)
        raise UserError(f"{e}; use --on-error skip to skip and count such documents") from None
    except BaseException as e:
        code = stop_code(e)
        if code is None:
            raise
        done = len(list(work_dir.glob("sig_*.done.json")))
        raise Interrupted(
            f"interrupted: {done} of {len(chunks)} chunks hashed and kept in {work_dir}; "
            f"run the same command again to resume",
            code,
        ) from None
    return finish(cfg, chunks, scans, work_dir, started)
