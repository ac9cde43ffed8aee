"""Process group, megatron parallel state and seeds for one run.

Under torchrun the rendezvous comes from the environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
...). As a single plain process (in-process tests, `python -m llmctl.train.entry` without
torchrun) a one-rank group is started on an in-memory store: megatron-core calls
`torch.distributed` unconditionally (e.g. `BlendedDataset` asks for the rank). Backend: NCCL on
GPUs, gloo on CPU.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from llmctl.plan import Layout


@dataclass(frozen=True, slots=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    on_gpu: bool


def init_distributed(timeout_minutes: int = 30) -> DistEnv:
    """Start `torch.distributed` (once per process) and install the CPU layer when needed."""
    import datetime

    import torch
    import torch.distributed as dist

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        from llmctl.train import cpu_compat

        cpu_compat.install()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        timeout = datetime.timedelta(minutes=timeout_minutes)
        backend = "nccl" if on_gpu else "gloo"
        if on_gpu:
            torch.cuda.set_device(local_rank)
        if "RANK" in os.environ:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:  # one plain process: an in-memory store, no port, environment untouched
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(
                backend=backend, store=store, rank=0, world_size=1, timeout=timeout
            )
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, on_gpu)


def init_model_parallel(layout: Layout, seed: int, on_gpu: bool) -> None:
    """Create megatron's TP/PP/CP/EP/DP groups and seed every RNG (megatron's offsets)."""
    import numpy as np
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.interleaved else None,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
    )
    # One seed on every rank. Megatron's own trainer offsets it by 100*pp_rank; llmctl does
    # not, so the initial model does not depend on the PP split (see model.layer_spec).
    seed_here = seed
    random.seed(seed_here)
    np.random.seed(seed_here)
    torch.manual_seed(seed_here)
    if on_gpu:
        tensor_parallel.model_parallel_cuda_manual_seed(seed_here)
    else:
        from llmctl.train.cpu_compat import seed_model_parallel_rng

        seed_model_parallel_rng(
            seed_here,
            tp_rank=ps.get_tensor_model_parallel_rank(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
        )


def teardown(destroy_process_group: bool) -> None:
    """Destroy megatron's groups (and the process group when this process created it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if destroy_process_group and dist.is_initialized():
        dist.destroy_process_group()
