"""llmctl quantize: accuracy on the demo model, and overhead over calling llm-compressor directly.

Run: `python benchmarks/quant_compare.py [--iters 300] [--reps 3] [--workdir DIR]`.

1. Model: `llmctl train` (megatron-core, CPU) trains the tiny_cpu recipe widened to hidden 128 /
   FFN 256 (so every Linear input is a multiple of 128 and group-128 applies; the shipped demo's
   hidden 64 is not) with seq 128 on the demo corpus, then `llmctl export hf` writes it.
2. Accuracy: `llmctl quantize` with each scheme, perplexity on the corpus tail (held out from
   calibration) before/after, against the targets W8A16 <= +0.5% and W4A16 g128 GPTQ <= +2%.
3. Overhead, side by side in one process after imports are warm, alternated llmctl / direct:
   - direct: what a user writes against llm-compressor: load the model in bf16, build the same
     calibration `Dataset`, `oneshot` with the same recipe, `save_pretrained(save_compressed)`.
   - llmctl: `quantize_source` end to end (plan and checks, fp32 load + baseline perplexity,
     bf16 load, the same `oneshot`, save, tokenizer copy, reload + perplexity, report).
   Reported: llmctl's core (everything except the verification it adds: the fp32 load and the
   two perplexity passes) over direct, and end to end over direct.
Both sides use one torch thread (the machine's 2 cores are shared; more threads only add noise).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

SCHEMES = [
    ("W8A16", "rtn"),
    ("W4A16", "rtn"),
    ("W4A16", "gptq"),
    ("W8A8", "gptq"),
    ("FP8_DYNAMIC", "rtn"),
]
TARGETS = {("W8A16", "rtn"): 0.5, ("W4A16", "gptq"): 2.0}
SEQ, SAMPLES, EVAL_TOKENS = 128, 64, 16384


def train_and_export(work: Path, iters: int) -> tuple[Path, str]:
    """Train the widened demo model with llmctl and export it; returns (HF dir, data prefix)."""
    from llmctl.config import compose
    from llmctl.data.demo import prepare_demo_data
    from llmctl.hf.export import export_run
    from llmctl.run.rundir import create_run_dir
    from llmctl.train.checkpoint import make_checkpointer
    from llmctl.train.run import run_in_process

    prefix = prepare_demo_data(work / "data")
    run_dir = work / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = compose(
        "tiny_cpu",
        [
            "model.hidden_size=128",
            "model.ffn_hidden_size=256",
            f"model.seq_length={SEQ}",
            f"data.prefixes=[{prefix}]",
            f"data.tokenizer={work / 'data' / 'tokenizer' / 'tokenizer.json'}",
            f"data.cache_dir={work / 'cache'}",
            f"train.train_iters={iters}",
            f"train.lr_decay_iters={iters}",
            "train.lr=3e-3",
            f"checkpoint.interval={iters}",
            f"train.run_dir={run_dir}",
        ],
    )
    create_run_dir(cfg, None)
    t0 = time.perf_counter()
    run_in_process(cfg, run_dir, checkpointer=make_checkpointer(cfg, run_dir))
    print(f"trained {iters} steps in {time.perf_counter() - t0:.1f} s")
    out = work / "hf"
    t0 = time.perf_counter()
    export_run(run_dir, out, force=True)
    print(f"exported in {time.perf_counter() - t0:.1f} s")
    return out, prefix


def random_large(work: Path, tokenizer_dir: Path) -> Path:
    """A random-init Llama (hidden 512, FFN 1536, 4 layers, 15 M params) for timing only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = work / "large"
    if (out / "config.json").is_file():
        return out
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def llmctl_run(model: Path, prefix: str, out: Path, scheme: str, alg: str) -> dict[str, Any]:
    from llmctl.quant.quantize import quantize_source

    t0 = time.perf_counter()
    report = quantize_source(
        model,
        out,
        overrides={
            "scheme": scheme,
            "algorithm": alg,
            "num_calibration_samples": SAMPLES,
            "calibration_seq_length": SEQ,
        },
        data=prefix,
        num_eval_tokens=EVAL_TOKENS,
        force=True,
    ).as_dict()
    report["total_s"] = time.perf_counter() - t0
    return report


def direct_run(model: Path, prefix: str, out: Path) -> float:
    """W4A16 g128 GPTQ written directly against llm-compressor (same data, same recipe)."""
    import numpy as np
    import torch
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM

    from llmctl.data.indexed import read_header

    t0 = time.perf_counter()
    tokens = np.memmap(f"{prefix}.bin", dtype=read_header(prefix).dtype, mode="r")
    ids = np.asarray(tokens[: SAMPLES * SEQ], dtype=np.int64).reshape(SAMPLES, SEQ).tolist()
    ds = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * SEQ for _ in ids]})
    lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16)
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=True, strategy="group", group_size=128
        ),
    )
    recipe = GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])
    lm = oneshot(
        model=lm,
        recipe=recipe,
        dataset=ds,
        tokenizer=str(model),
        num_calibration_samples=SAMPLES,
        max_seq_length=SEQ,
    )
    shutil.rmtree(out, ignore_errors=True)
    lm.save_pretrained(str(out), save_compressed=True)
    return time.perf_counter() - t0


def accuracy(model: Path, prefix: str, work: Path) -> list[dict[str, Any]]:
    rows = []
    for scheme, alg in SCHEMES:
        r = llmctl_run(model, prefix, work / f"q_{scheme}_{alg}", scheme, alg)
        target = TARGETS.get((scheme, alg))
        rows.append({**r, "target_pct": target})
        verdict = (
            "" if target is None else ("PASS" if r["perplexity_change_pct"] <= target else "FAIL")
        )
        print(
            f"{scheme:12s} {alg:5s} ppl {r['perplexity_before']:.3f} -> "
            f"{r['perplexity_after']:.3f} ({r['perplexity_change_pct']:+.3f}%) "
            f"bits {r['bits_per_weight']:.3f}/{r['theoretical_bits_per_weight']:.3f} "
            f"size {r['size_before_bytes'] / 2**20:.2f} -> {r['size_after_bytes'] / 2**20:.2f} MiB "
            f"peak {r['peak_rss_bytes'] / 2**20:.0f} MiB {verdict}"
        )
    return rows


def overhead(model: Path, prefix: str, work: Path, reps: int) -> dict[str, Any]:
    direct_s, total_s, core_s = [], [], []
    direct_run(model, prefix, work / "warm")  # warm imports and caches for both sides
    for _ in range(reps):
        direct_s.append(direct_run(model, prefix, work / "direct"))
        r = llmctl_run(model, prefix, work / "llmctl", "W4A16", "gptq")
        verify = sum(r["phase_s"].get(k, 0.0) for k in ("load", "eval_before", "eval_after"))
        total_s.append(r["total_s"])
        core_s.append(r["total_s"] - verify)
    d, t, c = (statistics.median(x) for x in (direct_s, total_s, core_s))
    result = {
        "direct_s": d,
        "llmctl_core_s": c,
        "llmctl_total_s": t,
        "core_overhead_pct": 100 * (c / d - 1),
        "total_overhead_pct": 100 * (t / d - 1),
        "reps": reps,
        "direct_all_s": direct_s,
        "llmctl_core_all_s": core_s,
        "llmctl_total_all_s": total_s,
    }
    print(
        f"W4A16 g128 GPTQ, {SAMPLES}x{SEQ} calibration tokens, median of {reps}: direct {d:.2f} s, "
        f"llmctl core {c:.2f} s ({result['core_overhead_pct']:+.1f}%), llmctl end to end "
        f"{t:.2f} s ({result['total_overhead_pct']:+.1f}%, incl. verification)"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--overhead-only", action="store_true", help="Skip the accuracy table.")
    parser.add_argument("--workdir", default=str(Path.home() / ".cache" / "llmctl" / "bench-quant"))
    args = parser.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1")
    import torch

    torch.set_num_threads(1)
    work = Path(args.workdir)
    model, prefix = train_and_export(work, args.iters)
    rows = [] if args.overhead_only else accuracy(model, prefix, work)
    print("overhead, demo model (1.34 M params):")
    over = overhead(model, prefix, work, args.reps)
    print("overhead, random-init hidden-512 4-layer model (timing only):")
    large = random_large(work, work / "data" / "tokenizer")
    over_large = overhead(large, prefix, work, args.reps)
    (work / "quant_compare.json").write_text(
        json.dumps({"accuracy": rows, "overhead": over, "overhead_large": over_large}, indent=2)
    )
    print(f"results: {work / 'quant_compare.json'}")


if __name__ == "__main__":
    main()
