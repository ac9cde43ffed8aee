"""Preprocess throughput and memory: llmctl vs Megatron-LM's tools/preprocess_data.py.

Side by side in one run, same input, same tokenizer (a byte-level BPE trained here, loaded by
Megatron-LM as --tokenizer-type HuggingFaceTokenizer), same worker count. Two inputs: the
Python stdlib corpus (one source file per document, ~15 kB each) and the same text cut into
~1.5 kB documents (web-page sized, where per-document overhead shows). Also checks that both
tools write byte-identical .bin/.idx, and measures llmctl's peak RSS on a 1x and a 10x input.

    python benchmarks/data_preprocess.py --megatron-lm /tmp/Megatron-LM [--workers 1 2]

--megatron-lm is a checkout of NVIDIA/Megatron-LM whose megatron-core matches the installed
one (tag core_v0.16.1 here); extra import paths for it go in --megatron-pythonpath.
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
            "-t", str(tok), "-j", str(workers), "--json"]  # fmt: skip


def megatron_cmd(mlm: Path, inp: Path, prefix: Path, tok: Path, workers: int) -> list[str]:
    """Megatron-LM's tool with the same tokenizer folder."""
    return [sys.executable, str(mlm / "tools" / "preprocess_data.py"), "--input", str(inp),
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
            counts = json.loads(Path(f"{ours}.manifest.json").read_text())["counts"]
            rows.append({"input": label, "workers": w, "input_mb": inp.stat().st_size / 1e6,
                         "docs": counts["documents"], "tokens": counts["tokens"],
                         "llmctl": m_ours, "megatron": m_theirs,
                         "byte_equal": same_bytes(str(ours), f"{theirs}_text_document"),
                         "speedup": m_theirs["wall_s"] / m_ours["wall_s"],
                         "cpu_ratio": m_theirs["cpu_s"] / m_ours["cpu_s"]})  # fmt: skip
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True)
    parser.add_argument("--megatron-pythonpath", default="")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--max-docs", type=int, default=None, help="corpus size (None: all)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmctl-bench-preprocess"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, tok = prepare(args.work, args.max_docs)
    inputs = {"files": corpus, "short": short_docs(corpus, args.work / "corpus_short.jsonl")}
    rows = compare(args, inputs, tok)
    mem = {} if args.skip_memory else memory(args, inputs["short"], tok)
    load = os.getloadavg()
    report = {"date": time.strftime("%Y-%m-%d"), "loadavg": load, "rows": rows, "memory": mem}
    (args.work / "results.json").write_text(json.dumps(report, indent=2))
    print(f"results in {args.work / 'results.json'}")


if __name__ == "__main__":
    main()
