"""The demo data chain: corpus -> dedup -> tokenizer train -> preprocess, cached.

`prepare_demo_data(workdir)` is what `make demo`, the training demo and tests call. It builds
everything under `workdir` once; later calls find `demo.json` (the parameters and the output
prefix) and return at once. A changed parameter or a missing output rebuilds the chain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from llmctl.data.corpus import build_demo_corpus, is_demo_corpus
from llmctl.data.dedup import DedupConfig, dedup
from llmctl.data.indexed import bin_path, idx_path
from llmctl.data.manifest import manifest_path, read_json, stamp, write_json_atomic
from llmctl.data.preprocess import PreprocessConfig, preprocess
from llmctl.data.tokenizer import train_bpe
from llmctl.errors import UserError

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


_OWN = ("corpus.jsonl", "dedup", "tokenizer", "demo.json", "index-cache")  # + training's cache
_OWN_PREFIXES = (DEMO_PREFIX_NAME, "dedup.", ".corpus.jsonl.")


def _check_workdir(work: Path) -> None:
    """The demo rebuilds into `work` with force: only where nothing but its own outputs is.

    Raises:
        UserError: `work` is a file, cannot be written, or holds a file the demo did not write.
    """
    from llmctl.staging import check_writable_parent

    if work.exists() and not work.is_dir():
        raise UserError(f"{work} is a file; the demo writes a folder there")
    check_writable_parent(work / "demo.json")
    if not work.is_dir():
        return
    foreign = sorted(
        p.name
        for p in work.iterdir()
        if not (p.name in _OWN or p.name.startswith(_OWN_PREFIXES))
        or (p.name == "corpus.jsonl" and not (p.is_file() and is_demo_corpus(p)))
    )
    if foreign:
        raise UserError(
            f"{work} holds files the demo did not write ({', '.join(foreign[:3])}); "
            "choose a new or empty folder"
        )


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
    _check_workdir(work)
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
