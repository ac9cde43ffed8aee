"""Quality-filter throughput: llmctl's clean pipeline vs datatrove's same filters, one core.

Same documents (`llmctl.data.clean_corpus`: real text from this machine, 3,000 documents
cycled to the size asked), same filters at their defaults in the same order (Gopher
repetition, Gopher quality, C4, FineWeb: FineWeb's order; a document stops at the first filter
that rejects it, C4's line removal feeds the next filter), same keep/drop decisions (compared
here too). datatrove uses its default English word tokeniser (spaCy's blank English), as its
users run it. Timed: CPU seconds (process time) of the filter calls only, in this process, so
reading and writing are left out for both; then llmctl end to end (`llmctl data clean -j J`,
a fresh process, JSONL in and out, CPU of the process tree and its peak RSS). Ratios are
datatrove / llmctl in documents per CPU second. `--datatrove-max N` times datatrove on the
first N documents only (the same documents as the N-document run, the corpus being cycled)
for sizes above N, where its hours of CPU would add nothing but its constant rate.

    python benchmarks/data_clean.py --sizes 1000 10000
    python benchmarks/data_clean.py --sizes 1000000 --datatrove-max 10000 --e2e-only
    python benchmarks/data_clean.py --per-filter --sizes 1000    # llmctl CPU s per step
    python benchmarks/data_clean.py --langid          # py3langid accuracy per language, speed

datatrove and spaCy are dev dependencies (`pip install 'llmctl[dev]'`; neither pulls torch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from llmctl.data.clean import Pipeline
from llmctl.data.clean_config import CleanConfig
from llmctl.data.clean_corpus import build_corpus


def _corpus(size: int) -> list[str]:
    base = [d.text for d in build_corpus(max_docs=min(size, 3000), seed=0)]
    return [base[i % len(base)] for i in range(size)]


def llmctl_filters(texts: list[str]) -> tuple[float, list[bool]]:
    pipeline = Pipeline(CleanConfig(inputs=[]))
    t0 = time.process_time()
    kept = [pipeline.run(t).step is None for t in texts]
    return time.process_time() - t0, kept


def datatrove_filters(texts: list[str]) -> tuple[float, list[bool]]:
    from datatrove.data import Document
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    filters = [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(),
               FineWebQualityFilter()]  # fmt: skip
    filters[0].filter(Document(text="warm up the tokenizer.", id="0"))
    t0 = time.process_time()
    kept = []
    for i, text in enumerate(texts):
        doc = Document(text=text, id=str(i))
        kept.append(all(f.filter(doc) is True for f in filters))
    return time.process_time() - t0, kept


_LAUNCHER = """
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
if os.waitstatus_to_exitcode(status):
    sys.exit(1)
print(json.dumps([usage.ru_utime + usage.ru_stime, usage.ru_maxrss]))
"""
"""Runs the command and prints its CPU seconds and peak RSS (KiB, Linux: the largest single
process of its tree). A small process of its own, because a child forked from this one
(datatrove and spaCy loaded) would count this process's pages as its peak."""


def end_to_end(texts: list[str], workers: int = 1) -> tuple[float, float, int]:
    """(CPU seconds of the process tree, wall seconds, peak RSS in MiB) of
    `llmctl data clean -j workers` on `texts` as one JSONL file."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        with open(src, "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
        argv = [sys.executable, "-m", "llmctl", "data", "clean", str(src), "-o",
                str(Path(tmp) / "out"), "-j", str(workers), "--json"]  # fmt: skip
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], capture_output=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"llmctl data clean failed: {done.stderr.decode()[-2000:]}")
        cpu, maxrss = json.loads(done.stdout.decode().splitlines()[-1])
    return cpu, wall, maxrss // 1024


def speed(sizes: list[int], datatrove_max: int | None, workers: int, e2e_only: bool) -> None:
    print(
        "| docs | llmctl filters CPU s | datatrove CPU s (docs timed) | ratio "
        f"| llmctl end to end -j {workers} CPU s | wall s | peak RSS MiB "
        "| docs/CPU-s llmctl | docs/CPU-s datatrove | decisions differing |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        texts = _corpus(n)
        m = n if datatrove_max is None else min(n, datatrove_max)
        theirs, kept_theirs = datatrove_filters(texts[:m])
        cpu, wall, rss = end_to_end(texts, workers)
        if e2e_only:  # llmctl's rate is then its end-to-end one (reading and writing included)
            ours, cells = cpu, "(end to end)"
        else:
            ours, kept_ours = llmctl_filters(texts)
            differ = sum(a != b for a, b in zip(kept_ours, kept_theirs, strict=False))
            cells = f"{ours:.2f}"
        rate_ours, rate_theirs = n / ours, m / theirs
        differing = "-" if e2e_only else f"{differ} of {m:,}"
        print(f"| {n:,} | {cells} | {theirs:.2f} ({m:,}) | {rate_ours / rate_theirs:.1f}x "
              f"| {cpu:.2f} | {wall:.1f} | {rss} | {rate_ours:,.0f} | {rate_theirs:,.0f} "
              f"| {differing} |", flush=True)  # fmt: skip


def per_filter(sizes: list[int]) -> None:
    """llmctl's CPU seconds per step (word splitting apart): the first of three runs, with the
    word splitter's memo empty (cold: what a fresh process pays), and the best of the three."""
    from llmctl.data.filters import text as text_module
    from llmctl.data.filters.quality import Doc

    pipeline = Pipeline(CleanConfig(inputs=[]))
    names = ["words", *(s.value for s in pipeline.steps)]
    print(f"| docs | run | {' | '.join(names)} | total |")
    print("|---:|---|" + "---:|" * (len(names) + 1))
    clock = time.process_time
    for n in sizes:
        texts = _corpus(n)
        text_module._MEMO.clear()
        runs = []
        for _ in range(3):
            spent = dict.fromkeys(names, 0.0)
            for text in texts:
                doc, extra = Doc(text), {}
                t0 = clock()
                doc.words  # noqa: B018 - computed once, shared by the filters
                spent["words"] += clock() - t0
                for step in pipeline.steps:
                    t0 = clock()
                    reason = pipeline._step(step, doc, extra)
                    spent[step.value] += clock() - t0
                    if reason is not None:
                        break
            runs.append(spent)
        best = {k: min(r[k] for r in runs) for k in names}
        for label, row in (("cold", runs[0]), ("best of 3", best)):
            cells = " | ".join(f"{row[k]:.3f}" for k in names)
            print(f"| {n:,} | {label} | {cells} | {sum(row.values()):.3f} |", flush=True)


def langid() -> None:
    from llmctl.data.filters.langid import LanguageConfig

    cfg = LanguageConfig()
    docs = [d for d in build_corpus(max_docs=6000, seed=3) if d.source.startswith("catalogue")]
    hits, totals = Counter(), Counter()
    t0 = time.process_time()
    for d in docs:
        lang, _ = cfg.classify(d.text)
        totals[d.language] += 1
        hits[d.language] += lang == d.language
    cpu = time.process_time() - t0
    print("| language | documents | accuracy |")
    print("|---|---:|---:|")
    for lang in sorted(totals):
        print(f"| {lang} | {totals[lang]} | {hits[lang] / totals[lang]:.3f} |")
    n = sum(totals.values())
    print(f"| all | {n} | {sum(hits.values()) / n:.3f} |")
    print(f"\n{n / cpu:,.0f} documents per CPU second "
          f"(mean {sum(len(d.text) for d in docs) / n:,.0f} characters)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--datatrove-max", type=int, default=None,
                   help="Time datatrove on the first N documents only.")  # fmt: skip
    p.add_argument("-j", "--workers", type=int, default=1, help="Workers of the end-to-end run.")
    p.add_argument("--e2e-only", action="store_true",
                   help="Time llmctl end to end only.")  # fmt: skip
    p.add_argument("--per-filter", action="store_true", help="llmctl CPU seconds per step only.")
    p.add_argument("--langid", action="store_true", help="Language-ID accuracy and speed only.")
    args = p.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if args.langid:
        langid()
    elif args.per_filter:
        per_filter(args.sizes)
    else:
        speed(args.sizes, args.datatrove_max, args.workers, args.e2e_only)


if __name__ == "__main__":
    main()
