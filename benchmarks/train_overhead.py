"""llmctl train vs a minimal hand-written megatron-core loop: same model, data, layout, machine.

Run: `python benchmarks/train_overhead.py [--steps 30] [--reps 3]`.

Both sides run in fresh processes, alternated (bare, llmctl, bare, llmctl, ...) so machine load
drifts hit both alike. Each worker trains the same Llama-style model (4 layers, hidden 256,
seq 128, vocab 4096, GBS 8, MBS 4, TP=PP=DP=1, fp32) on the same demo corpus through megatron's
GPTDataset, with the same megatron DDP, Adam optimizer and cosine LR schedule. Throughput is
`(steps after warm-up) * tokens per step / wall time` between the end of the warm-up step and
the end of the last step, measured from per-step wall-clock stamps: for llmctl those are the
`time` fields of metrics.jsonl, so every per-step cost of the runner (loss reduction, metrics
file, panel/log line, LR lookup) is inside the measurement. The bare loop needs the same CPU
compatibility layer (megatron-core does not run on CPU without it), so it imports llmctl's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 5
MODEL = [
    "model.num_layers=4",
    "model.hidden_size=256",
    "model.ffn_hidden_size=1024",
    "model.num_attention_heads=8",
    "model.num_query_groups=8",
    "model.seq_length=128",
]


def _cfg(steps: int, cache: str, run_dir: str):
    from llmctl.config import compose

    return compose(
        "tiny_cpu",
        [
            *MODEL,
            f"train.train_iters={steps}",
            "train.eval_interval=0",
            "train.log_interval=1",
            f"data.cache_dir={cache}",
            f"train.run_dir={run_dir}",
        ],
    )


def _rates(stamps: list[float], tokens_per_step: int) -> dict[str, float]:
    """Throughput over the timed steps: wall-clock mean, and from the median step duration.

    The median is robust to steps disturbed by other jobs on a shared machine; the wall-clock
    figure counts every step. Both include all per-step work of the side measured.
    """
    timed = stamps[WARMUP - 1 :]
    steps = [b - a for a, b in itertools.pairwise(timed)]
    return {
        "wall": len(steps) * tokens_per_step / (timed[-1] - timed[0]),
        "median_step": tokens_per_step / statistics.median(steps),
    }


def worker_llmctl(steps: int, cache: str) -> dict[str, float]:
    """Train through llmctl's runner; throughput from metrics.jsonl stamps."""
    from llmctl.train import run_in_process

    with tempfile.TemporaryDirectory() as tmp:
        cfg = _cfg(steps, cache, tmp)
        run_in_process(cfg, tmp)
        records = [json.loads(x) for x in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    tokens = cfg.train.global_batch_size * cfg.model.seq_length
    return _rates([r["time"] for r in records], tokens)


def worker_bare(steps: int, cache: str) -> dict[str, float]:
    """A minimal megatron-core loop written by hand (what a user would write without llmctl)."""
    from functools import partial

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    from llmctl.data.demo import prepare_demo_data
    from llmctl.train import cpu_compat
    from llmctl.train.cpu_compat import CPU_KERNEL_FLAGS

    cpu_compat.install()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ps.initialize_model_parallel()
    cpu_compat.seed_model_parallel_rng(1234, tp_rank=0)
    torch.manual_seed(1234)
    config = TransformerConfig(
        num_layers=4,
        hidden_size=256,
        ffn_hidden_size=1024,
        num_attention_heads=8,
        num_query_groups=8,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layernorm_epsilon=1e-5,
        **CPU_KERNEL_FLAGS,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=4096,
        max_sequence_length=128,
        position_embedding_type="rope",
    )
    model = DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model
    )
    config.no_sync_func = model.no_sync
    config.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam", lr=3e-4, min_lr=3e-5, weight_decay=0.1, adam_beta2=0.95, clip_grad=1.0
        ),
        [model],
    )
    sched = OptimizerParamScheduler(
        opt, 0.0, 3e-4, 3e-5, 5, steps, "cosine", 0.1, 0.1, steps, "constant"
    )

    class Tok:
        vocab_size, eod, unique_identifiers = 4096, 0, {"bench": 1}

    prefix = prepare_demo_data(cache)
    ds_cfg = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=128,
        blend=([prefix], None),
        split="98,2,0",
        tokenizer=Tok(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        path_to_cache=str(Path(cache) / "index-cache"),
    )
    train_ds = BlendedMegatronDatasetBuilder(
        GPTDataset, [steps * 8, 0, 0], lambda: True, ds_cfg
    ).build()[0]

    def batches():
        i = 0
        while True:
            s = [train_ds[i + j] for j in range(4)]
            i += 4
            yield {
                k: torch.stack([x[k] for x in s])
                for k in ("tokens", "labels", "loss_mask", "position_ids")
            }

    def loss_fn(mask, out):
        loss = (out.float().view(-1) * mask.view(-1)).sum() / mask.sum()
        return loss, {"loss": loss.detach().clone()}

    def fwd(it, m):
        b = next(it)
        return m(b["tokens"], b["position_ids"], None, labels=b["labels"]), partial(
            loss_fn, b["loss_mask"].float()
        )

    it, fb, stamps = batches(), get_forward_backward_func(), []
    for _ in range(steps):
        model.zero_grad_buffer()
        opt.zero_grad()
        losses = fb(
            forward_step_func=fwd,
            data_iterator=it,
            model=model,
            num_microbatches=2,
            seq_length=128,
            micro_batch_size=4,
        )
        opt.step()
        sched.step(increment=1)
        float(losses[-1]["loss"])
        stamps.append(time.time())
    dist.destroy_process_group()
    return _rates(stamps, 8 * 128)


def worker_runner_cost(steps: int, cache: str) -> dict[str, float]:
    """Seconds per step of llmctl's own per-step work, timed alone (robust to machine load).

    That is everything the runner adds around megatron's forward/backward/optimizer step: the
    loss reduction (DP and PP all-reduces, `.item()`), the LR lookup, and rank 0's observer
    (metrics record, JSONL write + flush, memory probe, panel/log line, ETA).
    """
    import torch
    import torch.distributed as dist

    from llmctl.run.layout import resolve_layout
    from llmctl.train import cpu_compat, parallel
    from llmctl.train.loop import _reduce_loss
    from llmctl.train.run import _Observer

    del steps
    logger = logging.getLogger("llmctl")  # the entry's console handler, writing to /dev/null
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler(open(os.devnull, "w")))  # noqa: SIM115
    parallel.init_distributed()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _cfg(1000, cache, tmp)
        layout = resolve_layout(cfg, 1)
        parallel.init_model_parallel(layout, 1, on_gpu=False)
        obs = _Observer(cfg, Path(tmp), layout, on_gpu=False, rank=0)
        gbs = cfg.train.global_batch_size
        losses = [{"lm loss": torch.tensor(7.0)} for _ in range(layout.num_microbatches(gbs))]
        n = 500
        t0 = time.perf_counter()
        for i in range(1, n + 1):
            loss = _reduce_loss(losses, "cpu")
            obs.step(i, loss, 1.0, 3e-4, 0.4, 8 * i, None, log_now=True)
        per_step = (time.perf_counter() - t0) / n
        obs.close()
    parallel.teardown(destroy_process_group=True)
    cpu_compat.uninstall()
    assert not dist.is_initialized()
    return {"runner_s_per_step": per_step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache", default=str(Path.home() / ".cache/llmctl/demo"))
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both workers")
    ap.add_argument("--worker", choices=["bare", "llmctl", "runner_cost"])
    args = ap.parse_args()
    if args.worker:
        fns = {"bare": worker_bare, "llmctl": worker_llmctl, "runner_cost": worker_runner_cost}
        print(json.dumps(fns[args.worker](args.steps, args.cache)))
        return
    # One intra-op thread per worker: on the shared 2-core machine two OpenMP threads spin
    # against other jobs and step times swing 30x (measured); both sides get the same setting.
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": str(args.threads)}
    runs: dict[str, list[dict[str, float]]] = {"bare": [], "llmctl": []}
    for rep in range(args.reps):
        for side in ("bare", "llmctl"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    side,
                    "--steps",
                    str(args.steps),
                    "--cache",
                    args.cache,
                ],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            ).stdout
            runs[side].append(json.loads(out.strip().splitlines()[-1]))
            r = runs[side][-1]
            print(
                f"rep {rep} {side:7s} wall {r['wall']:8.1f}  median-step "
                f"{r['median_step']:8.1f} tokens/s",
                flush=True,
            )
    summary: dict[str, object] = {
        "steps": args.steps,
        "reps": args.reps,
        "threads": args.threads,
        "load_average": os.getloadavg(),
    }
    for metric in ("median_step", "wall"):
        bare = statistics.median(r[metric] for r in runs["bare"])
        ours = statistics.median(r[metric] for r in runs["llmctl"])
        summary[metric] = {
            "bare_tokens_per_s": bare,
            "llmctl_tokens_per_s": ours,
            "ratio": ours / bare,
        }
    cost = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--worker", "runner_cost", "--cache", args.cache],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )["runner_s_per_step"]
    bare_step_s = 8 * 128 / statistics.median(r["median_step"] for r in runs["bare"])
    summary["runner_cost"] = {
        "s_per_step": cost,
        "bare_step_s": bare_step_s,
        "fraction_of_step": cost / bare_step_s,
        "implied_ratio": bare_step_s / (bare_step_s + cost),
    }
    summary["runs"] = runs
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
