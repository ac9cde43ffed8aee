"""Peak memory of `llmctl data preprocess` on one huge document, per document byte.

One worker (`-j 1`, so the whole run is one process), one document per input, the CLI run
as a user runs it; the peak is the process's VmHWM, read at exit. The baseline is the same
command on a 4 KiB document, and the figure is the extra peak per input byte of the document
(the JSONL line or the text file):

    (VmHWM(document) - VmHWM(4 KiB document)) / document bytes

Documents: stdlib Python source (ASCII), and the same text with one non-ASCII character after
every 32 ASCII ones, either a 2-byte UTF-8 character (U+0436, stored by Python at 2 bytes per
character) or a 4-byte one (U+1F600, 4 bytes per character): mostly-ASCII text with a few wide
characters is the worst case for Python's string layout. Inputs as `.txt` (one file, one
document) and `.jsonl` (one line, UTF-8 as is, `ensure_ascii=False`), optionally `jsonl.gz` /
`jsonl.zst` (the same line compressed; its bytes counted uncompressed). Sizes in MiB of input.

    python benchmarks/data_memory.py --sizes 16 64 [--pythonpath OLD_CHECKOUT] [--json]

`--pythonpath` runs another copy of llmctl (for a before/after comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

_RUN = """
import atexit, os, runpy, sys, resource
def report():
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["LLMCTL_BENCH_OUT"], "w") as f:
        f.write(f"{hwm * 1024} {ru.ru_utime + ru.ru_stime}")
atexit.register(report)
sys.argv = ["llmctl", *sys.argv[1:]]
runpy.run_module("llmctl", run_name="__main__")
"""

WIDE = {"ascii": "", "2-byte": "\u0436", "4-byte": "\U0001f600"}


def source_text(min_chars: int) -> str:
    """ASCII Python source from the stdlib, repeated to at least `min_chars`."""
    parts, size = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        t = f.read_text(encoding="utf-8", errors="ignore").encode("ascii", "ignore").decode()
        parts.append(t)
        size += len(t)
        if size >= 8 << 20:
            break
    text = "".join(parts)
    return text * (1 + min_chars // len(text))


def document(base: str, script: str, nbytes: int) -> str:
    """About `nbytes` of UTF-8: `base` with one `WIDE[script]` character after every 32."""
    wide = WIDE[script]
    if wide:
        step = 32
        per = step + len(wide.encode())
        n = nbytes // per * step
        base = "".join(base[i : i + step] + wide for i in range(0, n, step))
    return base


def write_input(work: Path, base: str, script: str, mib: float, fmt: str) -> Path:
    """One document of `mib` MiB of input bytes as `.txt` or a one-line `.jsonl`."""
    path = work / f"doc_{mib:g}mib_{script}.{fmt}"
    if path.exists():
        return path
    if fmt.startswith("jsonl."):  # the same line, compressed
        plain = write_input(work, base, script, mib, "jsonl").read_bytes()
        if fmt.endswith(".gz"):
            import gzip

            path.write_bytes(gzip.compress(plain))
        else:
            import zstandard

            path.write_bytes(zstandard.ZstdCompressor().compress(plain))
        return path
    target = int(mib * (1 << 20))
    budget = target - 12 if fmt == "jsonl" else target
    text = document(base, script, budget)[:budget]
    data = text.encode()
    while fmt == "jsonl" and len(data := _line(text)) > target:
        text = text[: len(text) - (len(data) - target)]  # a character is at least one byte
    else:
        data = data[:target]
        data = data[: len(data.decode("utf-8", "ignore").encode())]
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def _input_bytes(path: Path) -> int:
    """Uncompressed size of an input (a compressed one is measured by its decompressed line)."""
    if path.suffix in (".gz", ".zst"):
        return path.with_suffix("").stat().st_size
    return path.stat().st_size


def _line(text: str) -> bytes:
    return (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode()


def train(work: Path, base: str) -> Path:
    """A 4096-entry byte-level BPE trained on 2 MB of the text (plus the wide characters)."""
    out = work / "tok"
    if not (out / "tokenizer.json").exists():
        from llmctl.data.tokenizer import train_bpe

        sample = base[: 2 << 20]
        train_bpe([sample, document(sample[:200_000], "2-byte", 100_000),
                   document(sample[:200_000], "4-byte", 100_000)], out)  # fmt: skip
    return out / "tokenizer.json"


def measure(inp: Path, tok: Path, pythonpath: str | None) -> tuple[int, float]:
    """Peak RSS (bytes) and CPU seconds of one `llmctl data preprocess -j 1` process."""
    out = inp.with_name(inp.name + ".hwm")
    env = {**os.environ, "LLMCTL_BENCH_OUT": str(out)}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    prefix = inp.with_name(inp.name + ".out")
    cmd = [sys.executable, "-c", _RUN, "data", "preprocess", str(inp), "-o", str(prefix),
           "-t", str(tok), "-j", "1", "--force", "--json"]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=inp.parent)
    hwm, cpu = out.read_text().split()
    return int(hwm), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[16, 64])
    parser.add_argument("--scripts", nargs="+", default=list(WIDE))
    parser.add_argument("--formats", nargs="+", default=["txt", "jsonl"])
    parser.add_argument("--pythonpath", default=None, help="run this llmctl copy instead")
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmctl-bench-memory"))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    base = source_text(int(max(args.sizes) * (1 << 20)) + 1)
    tok = train(args.work, base)
    rows = []
    for fmt in args.formats:
        for script in args.scripts:
            small = write_input(args.work, base, script, 1 / 256, fmt)
            base_hwm = min(measure(small, tok, args.pythonpath)[0] for _ in range(args.repeats))
            for mib in args.sizes:
                inp = write_input(args.work, base, script, mib, fmt)
                runs = [measure(inp, tok, args.pythonpath) for _ in range(args.repeats)]
                hwm, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
                n = _input_bytes(inp) - _input_bytes(small)
                row = {"format": fmt, "script": script, "mib": mib,
                       "doc_bytes": _input_bytes(inp), "baseline_mib": base_hwm / 2**20,
                       "peak_mib": hwm / 2**20, "bytes_per_byte": (hwm - base_hwm) / n,
                       "cpu_s": cpu, "loadavg": os.getloadavg()[0]}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "pythonpath": args.pythonpath,
              "rows": rows}  # fmt: skip
    (args.work / "results.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
