"""Preprocess throughput and memory: llmctl vs Megatron-LM's tools/preprocess_data.py.

Side by side in one run, same input, same tokenizer (a byte-level BPE trained here, loaded by
Megatron-LM as --tokenizer-type HuggingFaceTokenizer), same worker count. Two inputs: the
Python stdlib corpus (one source file per document, ~15 kB each) and the same text cut into
~1.5 kB documents (web-page sized, where per-document overhead shows). Also checks that both
tools write byte-identical .bin/.idx, and measures llmctl's peak RSS on a 1x and a 10x input.

    python benchmarks/data_preprocess.py --megatron-lm /tmp/Megatron-LM [--workers 1 2]
    python benchmarks/data_preprocess.py --megatron-lm /tmp/Megatron-LM --corpus big \
        --min-mb 200 --skip-short --skip-memory        # >= 200 MB: stdlib + site-packages
    python benchmarks/data_preprocess.py --megatron-lm /tmp/Megatron-LM --only-big-docs \
        --big-docs-mib 1 16 32 60                       # peak RSS on 16-60 MiB documents

--megatron-lm is a checkout of NVIDIA/Megatron-LM whose megatron-core matches the installed
one (tag core_v0.16.1 here), unmodified: a small runner skips `megatron.training`'s GPU-only
package imports (the tool never uses them) and stubs `six` when missing, as the byte-identity
test does; extra import paths go in --megatron-pythonpath.
Wall times are end to end (process start to exit), as a user sees them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t
use = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall_s": wall, "cpu_s": use.ru_utime + use.ru_stime,
                  "max_rss_mib": use.ru_maxrss / 1024}))
"""


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """Run `cmd` under a fresh wrapper: wall time, CPU time of the whole process tree (less
    sensitive than wall time to other load on a shared machine), largest RSS of any process."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *cmd],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["loadavg_1m_after"] = os.getloadavg()[0]
    if result["rc"] != 0:
        raise RuntimeError(f"failed: {' '.join(cmd)}")
    return result


def prepare(work: Path, max_docs: int | None) -> tuple[Path, Path]:
    """The stdlib corpus and a 4096-token BPE trained on it."""
    from llmctl.data.corpus import build_demo_corpus
    from llmctl.data.tokenizer import train_tokenizer

    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        build_demo_corpus(corpus, max_docs=max_docs)
    tok = work / "tok"
    if not (tok / "tokenizer.json").exists():
        train_tokenizer([str(corpus)], tok, vocab_size=4096)
    return corpus, tok


def big_corpus(out: Path, min_mb: int) -> Path:
    """>= min_mb MB of JSONL: every stdlib and site-packages .py file (sorted) as a document,
    the stdlib first, until the size is reached; no download."""
    if out.exists():
        return out
    import site
    import sysconfig

    roots = [Path(sysconfig.get_paths()["stdlib"]), *map(Path, site.getsitepackages())]
    tmp, size = out.with_name(out.name + ".tmp"), 0
    with open(tmp, "w", encoding="utf-8") as g:
        for root in roots:
            for f in sorted(root.rglob("*.py")):
                try:
                    text = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip():
                    continue
                line = json.dumps({"text": text, "source": str(f)}, ensure_ascii=False) + "\n"
                g.write(line)
                size += len(line.encode())
                if size >= min_mb * 1_000_000:
                    break
            if size >= min_mb * 1_000_000:
                break
    tmp.replace(out)
    return out


def big_docs(work: Path, corpus: Path, mib: int, ascii_only: bool) -> Path:
    """One JSONL file holding a single `mib`-MiB document cut from the corpus text (ASCII-only
    when asked: a Python str of non-ASCII text takes 2 or 4 bytes per character)."""
    out = work / f"doc_{mib}mib{'_ascii' if ascii_only else ''}.jsonl"
    if out.exists():
        return out
    with open(corpus, encoding="utf-8") as f:
        text = "".join(json.loads(line)["text"] for line in f)
    if ascii_only:
        text = text.encode("ascii", "ignore").decode()
    n = mib << 20
    out.write_text(json.dumps({"text": (text * (1 + n // len(text)))[:n]}) + "\n")
    return out


def short_docs(corpus: Path, out: Path, target_bytes: int = 1500) -> Path:
    """The same text cut into ~1.5 kB documents at blank lines (web-page-sized documents)."""
    if out.exists():
        return out
    with open(corpus, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as g:
        for line in f:
            doc: list[str] = []
            for para in json.loads(line)["text"].split("\n\n"):
                doc.append(para)
                if sum(map(len, doc)) >= target_bytes:
                    g.write(json.dumps({"text": "\n\n".join(doc)}) + "\n")
                    doc = []
            if doc and "".join(doc).strip():
                g.write(json.dumps({"text": "\n\n".join(doc)}) + "\n")
    return out


def llmctl_cmd(inp: Path, prefix: Path, tok: Path, workers: int) -> list[str]:
    """The llmctl CLI invocation."""
    return [sys.executable, "-m", "llmctl", "data", "preprocess", str(inp), "-o", str(prefix),
            "-t", str(tok), "-j", str(workers), "--json", "--force"]  # fmt: skip


_MLM_RUNNER = Path(__file__).resolve().parent / "megatron_lm_runner.py"


def megatron_cmd(mlm: Path, inp: Path, prefix: Path, tok: Path, workers: int) -> list[str]:
    """Megatron-LM's tool with the same tokenizer folder (through megatron_lm_runner.py)."""
    return [sys.executable, str(_MLM_RUNNER), str(mlm), "--input", str(inp),
            "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", str(tok), "--append-eod", "--workers", str(workers)]  # fmt: skip


def same_bytes(a: str, b: str) -> bool:
    """Whether two dataset prefixes hold identical .bin and .idx files."""
    return all(Path(a + s).read_bytes() == Path(b + s).read_bytes() for s in (".bin", ".idx"))


def compare(args: argparse.Namespace, inputs: dict[str, Path], tok: Path) -> list[dict]:
    """Both tools on every input and worker count."""
    mlm_env = {"PYTHONPATH": f"{args.megatron_lm}:{args.megatron_pythonpath}"}
    rows = []
    for label, inp in inputs.items():
        for w in args.workers:
            ours = args.work / f"llmctl_{label}_w{w}"
            theirs = args.work / f"megatron_{label}_w{w}"
            runs: dict[str, list[dict]] = {"ours": [], "theirs": []}
            for _ in range(args.repeats):  # interleaved, so load changes hit both alike
                runs["ours"].append(measure(llmctl_cmd(inp, ours, tok, w)))
                mlm = megatron_cmd(args.megatron_lm, inp, theirs, tok, w)
                runs["theirs"].append(measure(mlm, mlm_env))
            m_ours, m_theirs = (min(r, key=lambda m: m["wall_s"]) for r in runs.values())
            cpu_ours, cpu_theirs = (min(m["cpu_s"] for m in r) for r in runs.values())
            counts = json.loads(Path(f"{ours}.manifest.json").read_text())["counts"]
            rows.append({"input": label, "workers": w, "input_mb": inp.stat().st_size / 1e6,
                         "docs": counts["documents"], "tokens": counts["tokens"],
                         "llmctl": m_ours, "megatron": m_theirs,
                         "byte_equal": same_bytes(str(ours), f"{theirs}_text_document"),
                         "speedup": m_theirs["wall_s"] / m_ours["wall_s"],
                         "cpu_ratio": cpu_theirs / cpu_ours,
                         "cpu_per_worker_s": {"llmctl": cpu_ours / w, "megatron": cpu_theirs / w},
                         "all_runs": runs})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


def memory(args: argparse.Namespace, base: Path, tok: Path) -> dict:
    """llmctl's peak RSS (largest process) on an input and on 10 copies of it, 2 workers."""
    big = args.work / "memory_x10.jsonl"
    if not big.exists():
        data = base.read_bytes()
        with open(big, "wb") as f:
            for _ in range(10):
                f.write(data)
    out = {}
    for name, inp in (("1x", base), ("10x", big)):
        out[name] = measure(llmctl_cmd(inp, args.work / f"mem_{name}", tok, 2))
        out[name]["input_mb"] = inp.stat().st_size / 1e6
        print(json.dumps({name: out[name]}), flush=True)
    return out


def big_doc_memory(args: argparse.Namespace, corpus: Path, tok: Path) -> list[dict]:
    """llmctl's peak RSS (1 worker) on single documents of each size, ASCII and as found."""
    rows = []
    for mib in args.big_docs_mib:
        for ascii_only in (True, False):
            inp = big_docs(args.work, corpus, mib, ascii_only)
            m = measure(llmctl_cmd(inp, args.work / f"bigdoc_{mib}", tok, 1))
            rows.append({"doc_mib": mib, "ascii": ascii_only, "line_bytes": inp.stat().st_size,
                         **m})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True)
    parser.add_argument("--megatron-pythonpath", default="")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--max-docs", type=int, default=None, help="corpus size (None: all)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmctl-bench-preprocess"))
    parser.add_argument("--corpus", choices=["stdlib", "big"], default="stdlib")
    parser.add_argument("--min-mb", type=int, default=200, help="size of the big corpus")
    parser.add_argument("--skip-short", action="store_true", help="no ~1.5 kB-document input")
    parser.add_argument("--big-docs-mib", type=int, nargs="*", default=[])
    parser.add_argument("--only-big-docs", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, tok = prepare(args.work, args.max_docs)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "loadavg_start": os.getloadavg()}
    if args.big_docs_mib:
        report["big_docs"] = big_doc_memory(args, corpus, tok)
    if not args.only_big_docs:
        if args.corpus == "big":
            corpus = big_corpus(args.work / f"corpus_{args.min_mb}mb.jsonl", args.min_mb)
        inputs = {"files": corpus}
        if not args.skip_short:
            inputs["short"] = short_docs(corpus, args.work / f"{corpus.stem}_short.jsonl")
        report["rows"] = compare(args, inputs, tok)
        report["memory"] = {} if args.skip_memory else memory(args, inputs["files"], tok)
    report["loadavg_end"] = os.getloadavg()
    (args.work / "results.json").write_text(json.dumps(report, indent=2))
    print(f"results in {args.work / 'results.json'}")


if __name__ == "__main__":
    main()
