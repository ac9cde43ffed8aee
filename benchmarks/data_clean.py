"""Quality-filter throughput: llmctl's clean pipeline vs datatrove's same filters, one core.

Same documents (`llmctl.data.clean_corpus`: real text from this machine, cycled to the
size asked), same filters at their defaults in the same order (Gopher repetition, Gopher
quality, C4, FineWeb: FineWeb's order; a document stops at the first filter that rejects it,
C4's line removal feeds the next filter), same keep/drop decisions (compared here too).
datatrove uses its default English word tokeniser (spaCy's blank English), as its users run
it. Timed: CPU seconds (process time) of the filter calls only, in this process, so reading
and writing are left out for both; then llmctl end to end (`llmctl data clean -j 1`, a
fresh process, JSONL in and out, CPU of the process tree). Ratios are datatrove / llmctl.

    python benchmarks/data_clean.py --sizes 1000 10000
    python benchmarks/data_clean.py --langid          # py3langid accuracy per language, speed

datatrove and spaCy are dev dependencies (`pip install 'llmctl[dev]'`; neither pulls torch).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def end_to_end(texts: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        argv = [sys.executable, "-m", "llmctl", "data", "clean", str(src), "-o",
                str(Path(tmp) / "out"), "-j", "1", "--json"]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def speed(sizes: list[int]) -> None:
    print(
        "| docs | llmctl filters CPU s | datatrove CPU s | ratio | llmctl end to end CPU s "
        "| docs/CPU-s llmctl | docs/CPU-s datatrove | decisions differing |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        texts = _corpus(n)
        ours, kept_ours = llmctl_filters(texts)
        theirs, kept_theirs = datatrove_filters(texts)
        e2e = end_to_end(texts)
        differ = sum(a != b for a, b in zip(kept_ours, kept_theirs, strict=True))
        print(f"| {n:,} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.1f}x | {e2e:.2f} "
              f"| {n / ours:,.0f} | {n / theirs:,.0f} | {differ} |")  # fmt: skip


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
    p.add_argument("--langid", action="store_true", help="Language-ID accuracy and speed only.")
    args = p.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if args.langid:
        langid()
    else:
        speed(args.sizes)


if __name__ == "__main__":
    main()
