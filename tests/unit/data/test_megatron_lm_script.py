"""Side by side with Megatron-LM's own tools/preprocess_data.py (core_v0.16.1) on documents
that are empty, whitespace-only, non-ASCII, full of control characters, or larger than one
tokenizer batch: `.bin` and `.idx` are byte-identical (Megatron-LM at 2 workers, llmctl at 1
and 2; test_megatron_rule.py covers the rule at 1 and 2 workers without the checkout).

Needs a Megatron-LM checkout: `$MEGATRON_LM`, else /tmp/megatron-lm (for example
`git --git-dir=<mirror> archive core_v0.16.1 | tar -x -C /tmp/megatron-lm`); skipped without
one. The checkout is used as is, through benchmarks/megatron_lm_runner.py (the benchmark's
runner too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_megatron_rule import write_awkward

from llmctl.data.preprocess import PreprocessConfig, preprocess

pytestmark = pytest.mark.slow

RUNNER = Path(__file__).resolve().parents[3] / "benchmarks" / "megatron_lm_runner.py"


def _checkout() -> Path:
    path = Path(os.environ.get("MEGATRON_LM", "/tmp/megatron-lm"))
    if not (path / "tools" / "preprocess_data.py").is_file():
        pytest.skip(f"no Megatron-LM checkout at {path} (set MEGATRON_LM)")
    return path


def run_megatron_lm(checkout: Path, inp: Path, prefix: Path, tok_dir: Path, workers: int) -> Path:
    """Megatron-LM's script as a user runs it; returns its output prefix."""
    cmd = [sys.executable, str(RUNNER), str(checkout), "--input", str(inp),
           "--workers", str(workers), "--output-prefix", str(prefix),
           "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tok_dir),
           "--append-eod"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return Path(f"{prefix}_text_document")


def test_byte_identical_to_megatron_lm_on_awkward_documents(
    tmp_path: Path, hf_tokenizer: Path, corpus: Path
) -> None:
    """One Megatron-LM run (2 workers) on real documents interleaved with the awkward ones
    (the 1.1 MB one included once); llmctl at 1 and 2 workers, small chunks, gives the same
    bytes."""
    checkout = _checkout()
    awkward = write_awkward(tmp_path / "awkward.jsonl")
    mixed = tmp_path / "mixed.jsonl"
    real = corpus.read_bytes().split(b"\n")[:-1]  # not splitlines(): U+2028 is inside a line
    odd = awkward.read_bytes().split(b"\n")[:-1]
    small = [ln for ln in odd if len(ln) < 10_000]
    big = [ln for ln in odd if len(ln) >= 10_000]
    lines = [x for a, b in zip(real, small * 6, strict=False) for x in (a, b)] + big + small
    mixed.write_bytes(b"".join(ln + b"\n" for ln in lines))
    theirs = run_megatron_lm(checkout, mixed, tmp_path / "mlm", hf_tokenizer.parent, 2)
    for workers in (1, 2):
        ours = tmp_path / f"ours_{workers}"
        preprocess(PreprocessConfig(inputs=[str(mixed)], output_prefix=str(ours),
                                    tokenizer=str(hf_tokenizer), num_workers=workers,
                                    chunk_bytes=300_000))  # fmt: skip
        for suffix in (".bin", ".idx"):
            assert Path(f"{ours}{suffix}").read_bytes() == Path(f"{theirs}{suffix}").read_bytes(), (
                workers, suffix)  # fmt: skip
    assert lines.count(b'{"text": ""}') >= 3 and len(big) == 1  # the corpus is what it claims
