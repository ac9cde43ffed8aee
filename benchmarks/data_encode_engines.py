"""BPE engines that read the same tokenizer.json, side by side: CPU time and identity of ids.

One thread each (RAYON_NUM_THREADS=1, FASTOKENS_BPE_THREADS=1), the same batches (<= 512
documents or ~1 MB of text, as `llmctl data preprocess` makes them), ids compared document by
document with the first engine (the `tokenizers` library, which Megatron-LM runs through
transformers). Engines not installed are skipped.

    python benchmarks/data_encode_engines.py CORPUS.jsonl TOKENIZER.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["FASTOKENS_BPE_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import numpy as np

Encode = Callable[[list[str]], list[np.ndarray]]


def engines(path: str) -> dict[str, Encode]:
    """Every engine available here, as batch -> list of id arrays."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(path)
    out: dict[str, Encode] = {
        "tokenizers encode (per doc)": lambda b: [np.asarray(hf.encode(t).ids) for t in b],
        "tokenizers encode_batch_fast": lambda b: [
            np.asarray(e.ids) for e in hf.encode_batch_fast(b)
        ],
    }
    try:
        import fastokens

        ft = fastokens.Tokenizer.from_file(path)

        def flat(b: list[str]) -> list[np.ndarray]:
            ids, off = ft.encode_batch_flat(b, add_special_tokens=True)
            a, o = np.frombuffer(ids, np.uint32), np.frombuffer(off, np.uint64).astype(np.int64)
            return [a[o[i] : o[i + 1]] for i in range(len(b))]

        out["fastokens encode_batch_flat"] = flat
    except ImportError:
        pass
    try:
        import gigatoken

        gt = gigatoken.Tokenizer(path)
        out["gigatoken encode_batch_list"] = lambda b: [
            np.asarray(x) for x in gt.encode_batch_list(b, parallel=False)
        ]
    except ImportError:
        pass
    try:
        import kitoken

        kt = kitoken.Kitoken.from_file(path)
        out["kitoken encode"] = lambda b: [np.asarray(kt.encode(t, True)) for t in b]
    except ImportError:
        pass
    return out


def batches(texts: list[str], max_docs: int = 512, max_chars: int = 1 << 20) -> list[list[str]]:
    """Batches as preprocess forms them."""
    out, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if len(cur) >= max_docs or size >= max_chars:
            out.append(cur)
            cur, size = [], 0
    return [*out, cur] if cur else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("tokenizer")
    args = parser.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    reference: list[np.ndarray] | None = None
    for name, fn in engines(args.tokenizer).items():
        start = time.process_time()
        ids = [x for b in batches(texts) for x in fn(b)]
        cpu = time.process_time() - start
        reference = reference or ids
        differ = sum(not np.array_equal(a, b) for a, b in zip(ids, reference, strict=True))
        row = {"engine": name, "cpu_s": round(cpu, 3), "mb_per_cpu_s": round(mb / cpu, 1),
               "docs_differing": differ, "n": len(texts), "load": os.getloadavg()[0]}  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
