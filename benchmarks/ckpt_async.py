"""Checkpoint benchmark: async vs sync save of the same >= 1 GiB state, side by side, on CPU.

One in-process training run of a ~100M-parameter GPT (model + Adam state ~1.1 GiB in fp32)
through llmctl's real runner. At fixed steps the benchmark's checkpointer takes, of the same
state and in the same process:

- a warm-up save (the first save in a process starts megatron's writer machinery; excluded),
- bare megatron-core `dist_checkpointing.save` (sync, no llmctl commit protocol): the reference,
- llmctl sync save (megatron write + fsync + CRC32 manifest + atomic commit), 3 times,
- llmctl async save, then waiting at once: blocked ms and total ms, 3 times (interleaved with
  the sync saves; medians reported, samples listed),
- llmctl async save while training continues: the step times while the writer runs (the dip).

Then a second run resumes from the newest checkpoint: full validation (CRC32 of every byte),
quick validation (sizes), megatron load + restore, and start to first step.

Usage: python benchmarks/ckpt_async.py [--layers 4] [--hidden 1024] [--thp] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _corpus(prefix: Path) -> Path:
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(50, 400))
        builder.add_document(torch.from_numpy(rng.integers(1, 4000, n).astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def _cfg(args: argparse.Namespace, prefix: Path, iters: int) -> Any:
    from llmctl.config import compose

    h = args.hidden
    return compose(
        "tiny_cpu",
        [
            f"model.num_layers={args.layers}", f"model.hidden_size={h}",
            f"model.ffn_hidden_size={4 * h}", "model.num_attention_heads=8",
            "model.num_query_groups=8", f"model.vocab_size={args.vocab}", "model.seq_length=64",
            f"model.activation={args.activation}",
            "parallel.micro_batch_size=1", "train.global_batch_size=1",
            f"train.train_iters={iters}", "train.log_interval=1", "train.eval_interval=0",
            f"data.prefixes=[{prefix}]", f"data.cache_dir={prefix.parent / 'cache'}",
            "checkpoint.interval=1000", "checkpoint.keep_last=10",
        ],
    )  # fmt: skip


SAMPLES = 3  # sync and async saves each, interleaved on steps 4..9
OVERLAP_STEP = 12


def _bench_checkpointer(cfg: Any, run_dir: Path, out: dict[str, Any]) -> Any:
    from megatron.core import dist_checkpointing

    from llmctl.train.checkpoint import DistCheckpointer, sharded_state_dict

    samples: dict[str, list[float]] = {}

    def record(key: str, t0: float) -> None:
        samples.setdefault(key, []).append(1e3 * (time.perf_counter() - t0))
        out[key] = statistics.median(samples[key])
        out[f"{key}_samples"] = [round(x, 1) for x in samples[key]]

    class Bench(DistCheckpointer):
        """Saves at fixed steps and records timings (steps 2..12); step 13+ measure the dip.

        Sync and async saves are taken SAMPLES times each, interleaved (sync, async, ...), and
        reported as medians: a sync save's time varies with the page cache and write-back.
        """

        def after_step(self, state: Any) -> None:
            s = state.step
            if self.pending is not None:
                self._finalize(blocking=False)
                if self.pending is None:
                    out["async_overlap_committed_at_step"] = s
            t0 = time.perf_counter()
            if s == 2:
                self.save(state, use_async=False)  # warm-up
            elif s == 3:
                bare = run_dir / "bare_megatron"
                bare.mkdir()
                dist_checkpointing.save(sharded_state_dict(state, is_loading=False), str(bare))
                out["bare_megatron_sync_ms"] = 1e3 * (time.perf_counter() - t0)
            elif 4 <= s < 4 + 2 * SAMPLES and s % 2 == 0:
                self.save(state, use_async=False)
                record("sync_blocked_ms", t0)
                out["sync_total_ms"] = out["sync_blocked_ms"]
            elif 4 <= s < 4 + 2 * SAMPLES:
                self.save(state, use_async=True)
                record("async_blocked_ms", t0)
                self.wait()
                record("async_total_ms", t0)
            elif s == OVERLAP_STEP:
                self.save(state, use_async=True)
                out["async_overlap_blocked_ms"] = 1e3 * (time.perf_counter() - t0)
                out["async_overlap_started_after_step"] = s

    return Bench(cfg, run_dir)


def _state_bytes(run_dir: Path) -> int:
    from llmctl.run import ckpt_store as store

    newest = store.list_checkpoints(run_dir / "checkpoints", full=False)[0]
    return newest.size_bytes


def main() -> None:
    """Run the benchmark and print the figures as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--activation", default="swiglu", choices=["swiglu", "gelu"])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--thp", action="store_true",
        help="set THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator on transparent huge pages) "
        "before torch is imported: fewer page-table entries make fork() cheaper",
    )  # fmt: skip
    args = p.parse_args()
    if args.thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"

    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import DistCheckpointer
    from llmctl.train.model import count_parameters

    out: dict[str, Any] = {
        "date": "2026-11-30", "layers": args.layers, "hidden": args.hidden,
        "activation": args.activation, "thp_mem_alloc": args.thp,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="llmctl-ckpt-bench-") as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        prefix = _corpus(root / "data" / "corpus")
        run_dir = root / "run"
        cfg = _cfg(args, prefix, args.steps)
        ckpt = _bench_checkpointer(cfg, run_dir, out)
        result = run_in_process(cfg, run_dir, checkpointer=ckpt)
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        step_s = {r["step"]: r["step_time_s"] for r in rows}
        started = out["async_overlap_started_after_step"]
        done = out.get("async_overlap_committed_at_step", args.steps)
        during = [step_s[s] for s in range(started + 1, done + 1) if s in step_s]
        after = [step_s[s] for s in range(done + 1, args.steps + 1) if s in step_s]
        out["step_ms_while_writing"] = [round(1e3 * x, 1) for x in during]
        out["step_ms_median_no_save"] = round(
            1e3 * statistics.median(after or [step_s[OVERLAP_STEP - 1]]), 1
        )
        out["state_bytes"] = _state_bytes(run_dir)
        out["num_params"] = count_parameters(cfg.model)
        out["final_loss"] = result.final_loss

        cfg2 = _cfg(args, prefix, args.steps + 1)
        resume = DistCheckpointer(cfg2, run_dir)
        t0 = time.perf_counter()
        first_step: list[float] = []
        orig = resume.after_step

        def mark(state: Any) -> None:
            first_step.append(time.perf_counter())
            orig(state)

        resume.after_step = mark  # type: ignore[method-assign]
        run_in_process(cfg2, run_dir, checkpointer=resume)
        out["resume_validate_full_ms"] = 1e3 * (resume.validate_s or 0.0)
        out["resume_load_ms"] = 1e3 * (resume.load_s or 0.0)
        out["resume_start_to_first_step_ms"] = 1e3 * (first_step[0] - t0)
        from llmctl.run import ckpt_store as store

        newest = store.list_checkpoints(run_dir / "checkpoints")[0].path
        t0 = time.perf_counter()
        store.validate(newest, full=False)
        out["validate_quick_ms"] = 1e3 * (time.perf_counter() - t0)
    out["async_blocked_fraction_of_sync"] = out["async_blocked_ms"] / out["sync_blocked_ms"]
    rounded = {
        k: (round(v, 1 if v >= 10 else 4) if isinstance(v, float) else v) for k, v in out.items()
    }
    text = json.dumps(rounded, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
