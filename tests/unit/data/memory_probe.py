"""Peak RSS a preprocess call adds, measured in a fresh interpreter (shared by the memory
tests): `peaks(work, tokenizer, names)` runs one in-process preprocess per file in `work`, the
first a warm-up whose first-use costs go into the baseline, and returns each other file's VmHWM
rise above the VmRSS before its call (VmHWM reset through /proc/self/clear_refs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import json, sys
from pathlib import Path
from llmctl.data.preprocess import PreprocessConfig, preprocess

work, tok, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def run(name):
    cfg = PreprocessConfig(inputs=[str(work / name)], tokenizer=tok,
                           output_prefix=str(work / f"out_{name}"), num_workers=1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = status("VmRSS")
    preprocess(cfg)
    return status("VmHWM") - base

run(names[0])
print(json.dumps({name: run(name) for name in names[1:]}))
"""


def peaks(work: Path, tokenizer: Path, names: list[str], timeout_s: float = 600) -> dict[str, int]:
    """Bytes each of `names[1:]` adds to the peak RSS (`names[0]` warms up)."""
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(work), str(tokenizer), *names],
        capture_output=True, text=True, check=True, timeout=timeout_s,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))
