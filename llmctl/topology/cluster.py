"""Turn a probed `Topology` into a cluster description: the fields of `ClusterConfig`.

Why these rules (each number the planner later uses is either probed, from the datasheet table
in `gpus.py`, or a named assumption reported as a warning):

- GPU nodes: peaks, HBM bandwidth and NVLink bandwidth come from the known-GPU table matched by
  the probed name; memory size is the probed one when known (NVML), else the datasheet's. The
  NVLink domain is the probed one (largest NVLink-connected GPU set), except GB200, whose domain
  spans trays (NVL72) and cannot be seen from one node. An unknown GPU keeps its probed facts
  with peaks and bandwidths 0 and a warning.
- Inter-node bandwidth per GPU is the sum of active RDMA port rates (Gb/s / 8) divided by the
  GPUs per node; without RDMA ports a 10 GbE link is assumed (warned).
- CPU-only nodes: `device: cpu`, one rank per node (`gpus_per_node: 1`), memory = host memory.
  The fp32 peak is an upper bound: physical cores x clock x FLOP/cycle, where FLOP/cycle =
  2 FMA pipes x vector lanes x 2 (a fused multiply-add counts 2 FLOPs); lanes are 16 fp32 with
  AVX-512 on Intel, 8 with AVX2 (AMD Zen 4 runs AVX-512 as two 256-bit halves, so 8 there too)
  and 4 with SSE only. bf16 doubles it where AVX512_BF16 exists (dot-product instruction), else
  equals fp32. Memory bandwidth is measured: one-thread memcpy of 64 MiB, best of 10, counting
  bytes read plus written. Ranks of one node share memory, so the "NVLink" domain of a CPU node
  is its logical CPUs and its bandwidth is the measured memcpy bandwidth.
- Achievable fractions are assumptions (not measured here), the same as the shipped
  configs/cluster files; edit the saved file to calibrate.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from llmctl.errors import UserError
from llmctl.topology.gpus import KNOWN_GPUS, KnownGpu, match_gpu
from llmctl.topology.model import CpuInfo, Topology

# The planner's assumed large-GEMM fractions (as in configs/cluster/dgx_*.yaml, docs/planner.md).
GPU_ACHIEVABLE_FRACTION = {
    "fp32": 0.9,
    "tf32": 0.7,
    "bf16": 0.7,
    "fp16": 0.7,
    "fp8": 0.55,
    "fp4": 0.5,
}
CPU_ACHIEVABLE_FRACTION = {"fp32": 0.3, "bf16": 0.3}
#: Known GPUs whose step-time knobs were fitted on published runs (benchmarks/plan_fit.py):
#: their achievable fractions and efficiency knobs are read from these shipped
#: configs/cluster files at run time, so `topo --out` cannot drift from them.
FITTED_CLUSTER_FILES = {
    "a100_80gb_sxm": "dgx_a100_80gb",
    "h100_sxm": "dgx_h100",
    "h200_sxm": "dgx_h200",
    "b200": "dgx_b200",
    "gb200": "gb200_nvl72",
}
ASSUMED_ETHERNET_GBPS = 1.25  # 10 GbE, GB/s
IB_LATENCY_US = 5.0
ETHERNET_LATENCY_US = 50.0


def cpu_peak_tflops(cpu: CpuInfo) -> dict[str, float]:
    """Upper-bound dense peak of a CPU node (see the module docstring for the formula)."""
    flags = set(cpu.flags)
    intel = (cpu.vendor or "").lower() == "genuineintel"
    lanes = 16 if "avx512f" in flags and intel else 8 if "avx2" in flags else 4
    cores = cpu.num_physical_cores or cpu.num_logical
    fp32 = cores * (cpu.mhz or 2000.0) * 1e6 * 2 * lanes * 2 / 1e12
    bf16 = fp32 * (2 if "avx512_bf16" in flags else 1)
    return {"fp32": round(fp32, 4), "bf16": round(bf16, 4)}


def measure_memcpy_gbps(num_bytes: int = 64 * 2**20, repeats: int = 10) -> float:
    """One-thread memcpy bandwidth in GB/s (read + write bytes), best of `repeats`."""
    src, dst = bytearray(num_bytes), bytearray(num_bytes)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - start)
    return round(2 * num_bytes / best / 1e9, 2)


def _internode(topology: Topology, ranks_per_node: int) -> tuple[float, float, list[str]]:
    active = [n for n in topology.nics if n.active and n.rate_gbps]
    if active:
        total_gbs = sum(n.rate_gbps or 0.0 for n in active) / 8
        return round(total_gbs / ranks_per_node, 3), IB_LATENCY_US, []
    found = (
        f"{len(topology.nics)} NIC(s) of unknown rate or state"
        if topology.nics
        else "no active InfiniBand/RoCE port"
    )
    warning = f"{found}: inter-node link assumed 10 GbE (1.25 GB/s per node); edit the file"
    return ASSUMED_ETHERNET_GBPS / ranks_per_node, ETHERNET_LATENCY_US, [warning]


def cluster_description(
    topology: Topology, gpu: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The ClusterConfig fields describing this topology, and the warnings met on the way.

    Args:
        topology: a probed or parsed topology.
        gpu: a known-GPU key or name overriding the probed name (useful with `topo -m` files,
            which carry no GPU names).

    Raises:
        UserError: `gpu` given but not in the known-GPU table.
    """
    if topology.num_gpus == 0:
        return _cpu_description(topology)
    return _gpu_description(topology, gpu)


def _common(topology: Topology) -> dict[str, Any]:
    cpu = topology.cpu
    host_gib = topology.host_memory_gib
    return {
        "num_nodes": topology.num_nodes,
        "cpu_cores": cpu.num_logical if cpu else None,
        "host_memory_gib": round(host_gib, 2) if host_gib is not None else None,
        "nodes_per_switch": None,  # a node cannot see its fabric's leaf size: the user states it
    }


def _gpu_description(topology: Topology, gpu: str | None) -> tuple[dict[str, Any], list[str]]:
    name = gpu or topology.gpus[0].name
    known = match_gpu(name) if name else None
    if gpu is not None and known is None:
        keys = ", ".join(g.key for g in KNOWN_GPUS)
        raise UserError(f"--gpu {gpu!r}: not a known GPU; expected one of {keys}")
    unknown = f"unknown GPU {name or '(no name)'!r}: peaks and bandwidths set to 0; pass --gpu"
    warnings = [] if known else [unknown]
    per_node = topology.num_gpus
    bandwidth, latency, net_warnings = _internode(topology, per_node)
    domain, domain_warnings = _domain(topology, known)
    probed_gib = topology.gpus[0].memory_gib
    desc = {
        "name": _name(topology),
        "gpu_name": known.gpu_name if known else (name or "unknown"),
        "device": "cuda",
        "num_nodes": topology.num_nodes,
        "gpus_per_node": per_node,
        "hbm_gib": round(probed_gib, 2) if probed_gib else (known.hbm_gib if known else 0.0),
        "hbm_bandwidth_gb_s": known.hbm_bandwidth_gb_s if known else 0.0,
        "peak_tflops": dict(known.peak_tflops) if known else dict.fromkeys(("fp32", "bf16"), 0.0),
        "achievable_fraction": _fractions(known),
        "nvlink_domain_size": domain,
        "nvlink_bandwidth_gb_s": known.nvlink_bandwidth_gb_s if known and domain > 1 else 0.0,
        "internode_bandwidth_gb_s": bandwidth,
        "internode_latency_us": latency,
        "cuda_context_gib": 0.5,
        "nccl_buffer_gib": 1.0,
        "fragmentation_fraction": 0.05,
        "sm_count": known.sm_count if known else 0,
        "efficiency": dict(fitted_knobs(known)[1]),
    } | _common(topology)
    return desc, [*topology.warnings, *warnings, *net_warnings, *domain_warnings]


def _fractions(known: KnownGpu | None) -> dict[str, float]:
    keys = known.peak_tflops if known else ("fp32", "bf16")
    fitted = fitted_knobs(known)[0]
    return {k: fitted.get(k, GPU_ACHIEVABLE_FRACTION[k]) for k in keys}


def fitted_knobs(known: KnownGpu | None) -> tuple[dict[str, float], dict[str, Any]]:
    """The achievable fractions and efficiency knobs of the shipped cluster file fitted for
    `known` (see FITTED_CLUSTER_FILES); empty dicts for other GPUs."""
    import yaml

    from llmctl.resources import resource_dir

    name = FITTED_CLUSTER_FILES.get(known.key) if known else None
    if name is None:
        return {}, {}
    data = yaml.safe_load((resource_dir("configs") / "cluster" / f"{name}.yaml").read_text())
    return dict(data.get("achievable_fraction") or {}), dict(data.get("efficiency") or {})


def _domain(topology: Topology, known: KnownGpu | None) -> tuple[int, list[str]]:
    probed = topology.nvlink_domain_size
    if known is not None and known.key == "gb200" and probed > 1:
        return known.nvlink_domain_size, [
            f"GB200: NVLink domain taken as {known.nvlink_domain_size} (NVL72); one node sees "
            f"only its {probed} GPUs. Edit nvlink_domain_size for NVL36 or NVL4 systems"
        ]
    return probed, []


def _cpu_description(topology: Topology) -> tuple[dict[str, Any], list[str]]:
    cpu = topology.cpu
    if cpu is None:
        raise ValueError("a topology without GPUs must carry CPU facts to describe a cluster")
    memcpy = measure_memcpy_gbps()
    bandwidth, latency, net_warnings = _internode(topology, 1)
    peaks = cpu_peak_tflops(cpu)
    desc = {
        "name": _name(topology),
        "gpu_name": cpu.model,
        "device": "cpu",
        "num_nodes": topology.num_nodes,
        "gpus_per_node": 1,
        "hbm_gib": round(topology.host_memory_gib or 0.0, 2),
        "hbm_bandwidth_gb_s": memcpy,
        "peak_tflops": peaks,
        "achievable_fraction": {k: CPU_ACHIEVABLE_FRACTION[k] for k in peaks},
        "nvlink_domain_size": cpu.num_logical,
        "nvlink_bandwidth_gb_s": memcpy,
        "internode_bandwidth_gb_s": bandwidth,
        "internode_latency_us": latency,
        "cuda_context_gib": 0.0,
        "nccl_buffer_gib": 0.0,
        "fragmentation_fraction": 0.05,
        "sm_count": 0,
        "efficiency": {},
    } | _common(topology)
    gpu_note = f"no NVIDIA GPU ({topology.gpu_error}): described as a CPU node"
    return desc, [*topology.warnings, gpu_note, *net_warnings]


def _name(topology: Topology) -> str:
    text = topology.hostname or Path(topology.source).stem
    return "probed_" + (
        "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_") or "node"
    )


def probed_cluster() -> dict[str, Any]:
    """ClusterConfig fields of this host, probed now (`cluster=probe`): its GPUs, or its CPU
    when it has none, measured (`measured_cpu_fields`)."""
    from llmctl.topology.probe import probe

    topology = probe()
    desc, _ = cluster_description(topology)
    if desc["device"] == "cpu" and topology.cpu is not None:
        desc |= measured_cpu_fields(topology.cpu)
    return desc


def measured_cpu_fields(cpu: CpuInfo) -> dict[str, Any]:
    """A CPU node's peak, bandwidth and fixed costs from `llmctl.topology.cpu_probe` (GEMM,
    copy and per-op timings of this host, cached), on local_cpu.yaml's fitted knobs, measured
    with `OMP_NUM_THREADS` threads (else every logical CPU); `cpu_cores` is set to that count
    so a one-rank run gets the threads measured (the launcher gives each rank cores / ranks)."""
    import yaml

    from llmctl.resources import resource_dir
    from llmctl.topology.cpu_probe import measure_cpu, probed_cpu_fields

    local = yaml.safe_load((resource_dir("configs") / "cluster" / "local_cpu.yaml").read_text())
    asked = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(asked) if asked.isdigit() and int(asked) > 0 else cpu.num_logical
    measured = measure_cpu(cpu.model, threads)
    fields = probed_cpu_fields(measured, dict(local["efficiency"]))
    # cpu_cores: the threads measured with, which the launcher gives one rank (cores / ranks)
    return fields | {"gpu_name": f"{cpu.model} ({measured['capability']})", "cpu_cores": threads}


_HEADER = "# Written by `llmctl topo --out`"


def check_cluster_out(path: str | Path, force: bool = False) -> None:
    """`topo --out PATH` may write only where nothing is, or over its own earlier file (`force`).

    Raises:
        UserError: PATH is a folder, exists without `force`, was not written by `llmctl topo`,
            or its folder cannot be written.
    """
    from llmctl.staging import check_file_out

    check_file_out(Path(path), force, _HEADER, "topo --out writes a cluster YAML file there")


def save_cluster(topology: Topology, path: str | Path, gpu: str | None = None) -> list[str]:
    """Write the cluster description as YAML (keys = ClusterConfig fields), whole or not at
    all (a temporary file renamed into place); return warnings.

    Raises:
        UserError: `gpu` is not a known GPU, or the file cannot be written.
    """
    import yaml

    from llmctl.staging import write_text_whole

    if gpu is not None and match_gpu(gpu) is None:
        keys = ", ".join(g.key for g in KNOWN_GPUS)
        raise UserError(f"--gpu {gpu!r}: not a known GPU; expected one of {keys}")
    desc, warnings = cluster_description(topology, gpu)
    if gpu is not None and topology.num_gpus == 0:
        warnings = [*warnings, f"--gpu {gpu} ignored: {topology.source} has no GPUs"]
    header = [f"{_HEADER} from {topology.source}."]
    header += [f"# warning: {w}" for w in warnings]
    body = yaml.safe_dump(desc, sort_keys=False, default_flow_style=None)
    write_text_whole(Path(path), "\n".join(header) + "\n" + body)
    return warnings
