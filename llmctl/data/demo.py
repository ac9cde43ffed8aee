"""The demo data chain: corpus -> dedup -> tokenizer train -> preprocess, cached.

`prepare_demo_data(workdir)` is what `make demo`, the training demo and tests call. It builds
everything under `workdir` once; later calls find `demo.json` (the parameters and the output
prefix) and return at once. A changed parameter or a missing output rebuilds the chain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from llmctl.data.corpus import build_demo_corpus
from llmctl.data.dedup import DedupConfig, dedup
from llmctl.data.indexed import bin_path, idx_path
from llmctl.data.manifest import manifest_path, read_json, stamp, write_json_atomic
from llmctl.data.preprocess import PreprocessConfig, preprocess
from llmctl.data.tokenizer import train_bpe

DEMO_PREFIX_NAME = "demo_text_document"


def _texts(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def _is_built(workdir: Path, params: dict[str, int]) -> str | None:
    done = read_json(workdir / "demo.json")
    if not done or done.get("params") != params:
        return None
    prefix = done.get("prefix", "")
    ok = all(p.exists() for p in (bin_path(prefix), idx_path(prefix), manifest_path(prefix)))
    return prefix if ok else None


def prepare_demo_data(
    workdir: str | Path, *, max_docs: int = 400, vocab_size: int = 4096, num_workers: int = 1
) -> str:
    """Build (or reuse) the demo dataset under `workdir`; return its Megatron prefix.

    The tokenizer is `<workdir>/tokenizer/tokenizer.json`; its vocabulary size and EOD id are
    in `<prefix>.manifest.json` under "tokenizer". One process by default: callers may have
    torch loaded, and forking such a process is best avoided; the demo is small.
    """
    work = Path(workdir).resolve()
    params = {"max_docs": max_docs, "vocab_size": vocab_size, "version": 1}
    if cached := _is_built(work, params):
        return cached
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    build_demo_corpus(corpus, max_docs=max_docs)
    # force: the work folder is the demo's own; a changed parameter rebuilds its outputs
    dd_cfg = DedupConfig(inputs=[str(corpus)], output_dir=str(work / "dedup"), force=True)
    dd_cfg.num_workers = num_workers
    dedup(dd_cfg)
    deduped = work / "dedup" / "corpus.jsonl"
    tokenizer = train_bpe(_texts(deduped), work / "tokenizer", vocab_size=vocab_size)
    prefix = str(work / DEMO_PREFIX_NAME)
    pre_cfg = PreprocessConfig(
        inputs=[str(deduped)],
        output_prefix=prefix,
        tokenizer=str(tokenizer),
        num_workers=num_workers,
        chunk_bytes=2 << 20,
        dedup=dd_cfg.params(),
        force=True,
    )
    preprocess(pre_cfg)
    write_json_atomic(work / "demo.json", {**stamp(), "params": params, "prefix": prefix})
    return prefix
