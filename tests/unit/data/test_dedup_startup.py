"""Issue 12, finding 7: `llmctl data dedup` starts light: no torch, megatron, transformers,
scipy or tokenizer libraries, no pydantic or config stack, no other command's CLI module, and
none of numpy.random, numpy.ma, zipfile or multiprocessing are imported (checked with
`python -X importtime`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = {"torch", "megatron", "transformers", "scipy", "tokenizers", "fastokens", "sentencepiece",
         "tiktoken", "pyarrow", "datatrove", "rensa", "datasketch", "pydantic", "omegaconf",
         "hydra", "yaml"}  # fmt: skip


def test_dedup_command_imports_no_heavy_library(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    texts = [f"document number {i} " * 20 for i in range(30)] + ["document number 1 " * 20]
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "llmctl", "data", "dedup", str(inp),
         "-o", str(tmp_path / "out"), "-j", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    names = {
        line.split("|")[-1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:")
    }
    modules = {name.split(".")[0] for name in names}
    assert "numpy" in modules  # the parse worked
    assert not modules & HEAVY, sorted(modules & HEAVY)
    # start-up the dedup path does not need: numpy's random and masked-array packages (via
    # np.random.default_rng, np.unique), zipfile (.npz) and multiprocessing with one worker
    avoidable = {"numpy.random", "numpy.ma", "zipfile", "multiprocessing"}
    assert not names & avoidable, sorted(names & avoidable)
    cli = {name for name in names if name.startswith("llmctl.cli.")}
    assert "llmctl.cli.main" in cli, sorted(cli)
    assert cli <= {"llmctl.cli.main", "llmctl.cli.lazy", "llmctl.cli.data"}, sorted(cli)
    assert (tmp_path / "out" / "in.jsonl").read_text().count("\n") == 30
