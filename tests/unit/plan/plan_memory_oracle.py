"""Worker of the CPU memory oracle (test_plan_memory_oracle): 2 spawned gloo ranks run
megatron-core GPT models at each layout of `LAYOUTS` through `llmctl.train.memprobe` and
write what each rank held to `mem<rank>.json`. Not a test module (no `test_` prefix)."""

from __future__ import annotations

import os
from typing import Any

#: name -> memprobe.ProbeLayout fields; 2 ranks each (DP = 2 / (TP*PP)). No sequence
#: parallelism: megatron-core's local (torch) norms refuse it, and TE does not run on CPU.
LAYOUTS: dict[str, dict[str, Any]] = {
    "tp1_dp2": dict(),
    "tp1_dp2_distopt": dict(distributed_optimizer=True),
    "tp1_dp2_selective": dict(recompute="selective"),
    "tp1_dp2_full": dict(recompute="full"),
    "tp2": dict(tp=2),
    "tp2_selective": dict(tp=2, recompute="selective"),
    "tp2_full": dict(tp=2, recompute="full"),
    "pp2_m4": dict(pp=2, num_microbatches=4),
    "pp2_vpp2_m4": dict(pp=2, vpp=2, num_microbatches=4),
    "pp2_m4_full": dict(pp=2, num_microbatches=4, recompute="full"),
    # FSDP as llmctl train runs it (megatron-core's torch FSDP2 wrapper): shards plus the
    # units gathered at once (memprobe.FsdpMeter).
    "tp1_dp2_fsdp": dict(fsdp=True),
    "tp1_dp2_fsdp_m2": dict(fsdp=True, num_microbatches=2),
    "tp1_dp2_fsdp_full": dict(fsdp=True, recompute="full"),
}


def worker(rank: int, world: int, port: int, out_dir: str, names: list[str]) -> None:
    """One gloo rank: probe every layout in `names`, write `mem<rank>.json`."""
    import json
    import time

    import torch
    import torch.distributed as dist

    from llmctl.train import cpu_compat, memprobe

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu_compat.install()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shape = memprobe.ProbeShape()
    out: dict[str, dict[str, float]] = {}
    for name in names:
        start = time.perf_counter()
        out[name] = {**memprobe.probe(shape, memprobe.ProbeLayout(**LAYOUTS[name])).as_dict()}
        out[name]["seconds"] = time.perf_counter() - start
    with open(os.path.join(out_dir, f"mem{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.destroy_process_group()
