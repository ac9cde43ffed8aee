"""The demo chain (corpus -> dedup -> tokenizer -> preprocess) builds once, then is cached."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llmctl.data.demo import prepare_demo_data
from llmctl.data.manifest import manifest_path


@pytest.mark.slow
def test_prepare_demo_data_builds_then_caches(tmp_path: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    start = time.perf_counter()
    prefix = prepare_demo_data(tmp_path, max_docs=150)
    ds = IndexedDataset(prefix)
    manifest = json.loads(manifest_path(prefix).read_text())
    assert len(ds) == manifest["counts"]["documents"] > 100
    assert manifest["dedup"]["threshold"] == 0.8
    assert manifest["tokenizer"]["vocab_size"] == 4096
    assert int(ds[0][-1]) == manifest["tokenizer"]["eod"]
    first = time.perf_counter() - start
    start = time.perf_counter()
    assert prepare_demo_data(tmp_path, max_docs=150) == prefix
    assert time.perf_counter() - start < min(1.0, first)
