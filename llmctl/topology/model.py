"""Frozen values that describe one node: GPUs, NVLink, NICs, CPUs, memory and the SLURM job.

Every probe (NVML, sysfs, /proc, SLURM variables) and every parser (saved `nvidia-smi topo -m`,
saved JSON) produces a `Topology`; `llmctl topo` renders it and `--save` turns it into a cluster
description. `to_dict`/`topology_from_dict` give the JSON form that `--json` prints and
`--from` reads back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    """One GPU as NVML or `nvidia-smi topo -m` sees it.

    `nvlink_peers` are the indices of GPUs reached over direct NVLink; `nvswitch` is true when
    the GPU's links end at an NVSwitch (then every switch-attached GPU of the node is reachable).
    """

    index: int
    name: str = ""
    memory_gib: float | None = None
    compute_capability: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    nvlink_links: int = 0
    nvlink_peers: tuple[int, ...] = ()
    nvswitch: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NicInfo:
    """One RDMA port (InfiniBand or RoCE) from /sys/class/infiniband, or a NIC column of topo -m."""

    name: str
    port: int | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None
    state: str | None = None
    numa_node: int | None = None

    @property
    def active(self) -> bool:
        """True when the port state is ACTIVE (unknown state counts as not active)."""
        return self.state is not None and "ACTIVE" in self.state.upper()


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuInfo:
    """Host CPUs from /proc/cpuinfo: logical CPUs, physical cores, model and ISA flags."""

    model: str
    num_logical: int
    num_physical_cores: int | None = None
    mhz: float | None = None
    vendor: str | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmInfo:
    """The SLURM job this process runs in (from SLURM_* variables)."""

    job_id: str
    num_nodes: int
    nodes: tuple[str, ...] = ()
    gpus_on_node: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """Everything known about one node (and its SLURM job, if any).

    `source` says where the facts came from ("probe", a file path). `gpu_error` holds NVML's
    reason when no NVIDIA GPU could be seen. `devices`/`matrix` keep the raw `nvidia-smi topo -m`
    connectivity (empty when probed through NVML).
    """

    source: str
    hostname: str = ""
    gpus: tuple[GpuInfo, ...] = ()
    nics: tuple[NicInfo, ...] = ()
    cpu: CpuInfo | None = None
    host_memory_gib: float | None = None
    slurm: SlurmInfo | None = None
    gpu_error: str | None = None
    devices: tuple[str, ...] = ()
    matrix: tuple[tuple[str, ...], ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @property
    def num_gpus(self) -> int:
        """GPUs on this node."""
        return len(self.gpus)

    @property
    def num_nodes(self) -> int:
        """Nodes of the SLURM job, or 1 outside SLURM."""
        return self.slurm.num_nodes if self.slurm is not None else 1

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs in the largest set joined by NVLink (1 without NVLink; 1 on a CPU-only node)."""
        return max(nvlink_domains(self.gpus), default=1)


def nvlink_domains(gpus: tuple[GpuInfo, ...]) -> list[int]:
    """Sizes of the NVLink-connected components of a node's GPUs (union-find).

    Direct peers are joined; all NVSwitch-attached GPUs form one component.
    """
    parent = {g.index: g.index for g in gpus}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    switched = [g.index for g in gpus if g.nvswitch]
    pairs = [(g.index, p) for g in gpus for p in g.nvlink_peers if p in parent]
    pairs += [(switched[0], i) for i in switched[1:]]
    for a, b in pairs:
        parent[find(a)] = find(b)
    sizes: dict[int, int] = {}
    for i in parent:
        sizes[find(i)] = sizes.get(find(i), 0) + 1
    return sorted(sizes.values(), reverse=True)


def to_dict(topology: Topology) -> dict[str, Any]:
    """The JSON form of a topology (what `llmctl topo --json` prints), with derived facts added."""
    data = asdict(topology)
    data["num_gpus"] = topology.num_gpus
    data["num_nodes"] = topology.num_nodes
    data["nvlink_domain_size"] = topology.nvlink_domain_size
    return data


def topology_from_dict(data: dict[str, Any]) -> Topology:
    """Rebuild a topology from `to_dict` output.

    Raises:
        KeyError, TypeError, ValueError: the dict is not what `to_dict` writes.
    """
    cpu = data.get("cpu")
    slurm = data.get("slurm")
    return Topology(
        source=str(data["source"]),
        hostname=str(data.get("hostname", "")),
        gpus=tuple(_gpu(g) for g in data.get("gpus", [])),
        nics=tuple(NicInfo(**n) for n in data.get("nics", [])),
        cpu=CpuInfo(**{**cpu, "flags": tuple(cpu.get("flags", ()))}) if cpu else None,
        host_memory_gib=data.get("host_memory_gib"),
        slurm=SlurmInfo(**{**slurm, "nodes": tuple(slurm.get("nodes", ()))}) if slurm else None,
        gpu_error=data.get("gpu_error"),
        devices=tuple(data.get("devices", ())),
        matrix=tuple(tuple(row) for row in data.get("matrix", ())),
        warnings=tuple(data.get("warnings", ())),
    )


def _gpu(g: dict[str, Any]) -> GpuInfo:
    return GpuInfo(**{**g, "nvlink_peers": tuple(int(p) for p in g.get("nvlink_peers", ()))})
