"""Preprocess throughput and memory: llmctl vs Megatron-LM's tools/preprocess_data.py.

Side by side in one run, same input (the Python stdlib corpus, JSONL), same tokenizer (a
byte-level BPE trained here, loaded by Megatron-LM as --tokenizer-type HuggingFaceTokenizer),
same worker count. Also checks that both write byte-identical .bin/.idx, and measures llmctl's
peak RSS on a 1x and a 10x input.

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
print(json.dumps({"rc": rc, "wall_s": wall,
                  "max_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """Run `cmd` under a fresh wrapper; wall time and the largest RSS of any process in it."""
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


def prepare(work: Path) -> tuple[Path, Path]:
    """The stdlib corpus (all files) and a 4096-token BPE trained on it."""
    from llmctl.data.corpus import build_demo_corpus
    from llmctl.data.tokenizer import train_tokenizer

    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        build_demo_corpus(corpus, max_docs=None)
    tok = work / "tok"
    if not (tok / "tokenizer.json").exists():
        train_tokenizer([str(corpus)], tok, vocab_size=4096)
    return corpus, tok


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron-lm", type=Path, required=True)
    parser.add_argument("--megatron-pythonpath", default="")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmctl-bench-preprocess"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, tok = prepare(args.work)
    size_mb = corpus.stat().st_size / 1e6
    mlm_env = {"PYTHONPATH": f"{args.megatron_lm}:{args.megatron_pythonpath}"}
    rows = []
    for w in args.workers:
        ours = args.work / f"llmctl_w{w}"
        theirs = args.work / f"megatron_w{w}"
        m_ours = measure(llmctl_cmd(corpus, ours, tok, w))
        m_theirs = measure(megatron_cmd(args.megatron_lm, corpus, theirs, tok, w), mlm_env)
        manifest = json.loads(Path(f"{ours}.manifest.json").read_text())
        tokens = manifest["counts"]["tokens"]
        equal = same_bytes(str(ours), f"{theirs}_text_document")
        rows.append({"workers": w, "input_mb": size_mb, "tokens": tokens,
                     "llmctl": m_ours, "megatron": m_theirs, "byte_equal": equal,
                     "speedup": m_theirs["wall_s"] / m_ours["wall_s"]})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    big = args.work / "corpus_x10.jsonl"
    if not big.exists():
        with open(big, "wb") as f:
            for _ in range(10):
                f.write(corpus.read_bytes())
    memory = {}
    for name, inp in (("1x", corpus), ("10x", big)):
        memory[name] = measure(llmctl_cmd(inp, args.work / f"mem_{name}", tok, 2))
        memory[name]["input_mb"] = inp.stat().st_size / 1e6
        print(json.dumps({name: memory[name]}), flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "rows": rows, "memory": memory}
    (args.work / "results.json").write_text(json.dumps(report, indent=2))
    print(f"results in {args.work / 'results.json'}")


if __name__ == "__main__":
    main()
