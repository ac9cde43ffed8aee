"""Bad data input is a one-line UserError before any process starts (no torch here)."""

from __future__ import annotations

import os

import pytest

from llmctl.config import compose
from llmctl.errors import UserError
from llmctl.run.data import resolve_data
from llmctl.run.preflight import preflight


def test_missing_prefix_names_the_file(tmp_path):
    cfg = compose("tiny_cpu", [f"data.prefixes=[{tmp_path}/nope]"])
    with pytest.raises(UserError, match=r"nope\.bin not found; build it with `llmctl data"):
        resolve_data(cfg)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_prefix(tmp_path):
    for ext in (".bin", ".idx"):
        (tmp_path / f"d{ext}").write_bytes(b"x")
    (tmp_path / "d.idx").chmod(0)
    cfg = compose("tiny_cpu", [f"data.prefixes=[{tmp_path}/d]"])
    with pytest.raises(UserError, match="is not readable"):
        resolve_data(cfg)


def test_demo_corpus_is_found_with_its_tokenizer(demo_cache):
    spec = resolve_data(compose("tiny_cpu", [f"data.cache_dir={demo_cache}"]))
    assert spec.tokenizer_vocab_size == 4096
    assert spec.tokenizer_path and spec.tokenizer_path.endswith("tokenizer.json")
    assert spec.prefixes[0].startswith(str(demo_cache))


def test_tokenizer_larger_than_model_vocab(demo_cache):
    cfg = compose("tiny_cpu", [f"data.cache_dir={demo_cache}", "model.vocab_size=1024"])
    with pytest.raises(UserError, match=r"has 4096 tokens but model\.vocab_size=1024"):
        resolve_data(cfg)


def test_explicit_tokenizer_is_checked_too(demo_cache):
    tok = demo_cache / "tokenizer" / "tokenizer.json"
    cfg = compose(
        "tiny_cpu",
        [f"data.cache_dir={demo_cache}", f"data.tokenizer={tok}", "model.vocab_size=2048"],
    )
    with pytest.raises(UserError, match="has 4096 tokens"):
        resolve_data(cfg)
    cfg.data.tokenizer = str(demo_cache / "missing.json")
    with pytest.raises(UserError, match=r"missing\.json not found"):
        resolve_data(cfg)


def test_weights_must_match_prefixes(demo_cache):
    spec = resolve_data(compose("tiny_cpu", [f"data.cache_dir={demo_cache}"]))
    prefix = spec.prefixes[0]
    cfg = compose("tiny_cpu", [f"data.prefixes=[{prefix},{prefix}]"])
    cfg.data.weights = [1.0]  # compose validates this too; a hand-edited config.yaml may not
    with pytest.raises(UserError, match=r"data\.weights has 1 entries but data\.prefixes has 2"):
        resolve_data(cfg)


def test_preflight_refuses_gpu_precision_on_cpu_cluster(demo_cache):
    cfg = compose("tiny_cpu", [f"data.cache_dir={demo_cache}", "precision=bf16"])
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        preflight(cfg, world_size=1)
    ok = preflight(compose("tiny_cpu", [f"data.cache_dir={demo_cache}"]), world_size=1)
    assert ok.layout.world_size == 1 and ok.precision.name == "fp32"
