"""Probe the machine we run on: CPUs, memory, RDMA NICs, GPUs (NVML) and the SLURM job.

Each probe is a small function over a filesystem root (default "/") so tests can point it at a
fake sysfs/procfs tree; `probe()` composes them for the real machine. NVML (nvidia-ml-py) is
imported inside `probe_gpus`: a machine without it, or without an NVIDIA driver, still gets a
topology with CPUs and memory and the NVML error text.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmctl.topology.model import CpuInfo, GpuInfo, NicInfo, Topology
from llmctl.topology.slurm import probe_slurm


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def probe_cpu(root: str | Path = "/") -> CpuInfo:
    """Read /proc/cpuinfo: logical CPUs, physical cores, model name, clock and ISA flags."""
    text = _read(Path(root) / "proc/cpuinfo") or ""
    blocks = [b for b in text.split("\n\n") if "processor" in b]
    fields = [dict(_kv(line) for line in b.splitlines() if ":" in line) for b in blocks]
    first = fields[0] if fields else {}
    cores = {(f.get("physical id", "0"), f["core id"]) for f in fields if "core id" in f}
    model = first.get("model name") or first.get("Model") or first.get("cpu model") or "unknown"
    mhz = first.get("cpu MHz")
    return CpuInfo(
        model=model,
        num_logical=len(fields) or (os.cpu_count() or 1),
        num_physical_cores=len(cores) or None,
        mhz=float(mhz) if mhz else None,
        vendor=first.get("vendor_id"),
        flags=tuple((first.get("flags") or first.get("Features") or "").split()),
    )


def _kv(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def probe_memory_gib(root: str | Path = "/") -> float | None:
    """Host memory (MemTotal of /proc/meminfo) in GiB, or None if unreadable."""
    text = _read(Path(root) / "proc/meminfo") or ""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) / 2**20 if m else None


def probe_nics(root: str | Path = "/") -> tuple[NicInfo, ...]:
    """InfiniBand/RoCE ports from /sys/class/infiniband/<dev>/ports/<port>/{rate,link_layer,state}.

    `rate` reads like "400 Gb/sec (4X NDR)"; `link_layer` is "InfiniBand" or "Ethernet" (RoCE).
    """
    base = Path(root) / "sys/class/infiniband"
    nics = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        numa = _int_or_none(_read(dev / "device/numa_node"))
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            rate = re.match(r"\s*([\d.]+)\s*Gb/sec", _read(port / "rate") or "")
            nics.append(
                NicInfo(
                    name=dev.name,
                    port=int(port.name) if port.name.isdigit() else None,
                    rate_gbps=float(rate.group(1)) if rate else None,
                    link_layer=_read(port / "link_layer"),
                    state=_read(port / "state"),
                    numa_node=numa,
                )
            )
    return tuple(nics)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:1B:00.0" as sysfs spells it: "0000:1b:00.0"."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()


def pci_numa_node(bus_id: str, root: str | Path = "/") -> int | None:
    """NUMA node of a PCI device from /sys/bus/pci/devices/<id>/numa_node (-1 means none)."""
    value = _int_or_none(_read(Path(root) / "sys/bus/pci/devices" / bus_id / "numa_node"))
    return value if value is not None and value >= 0 else None


def probe_gpus(root: str | Path = "/") -> tuple[tuple[GpuInfo, ...], str | None]:
    """GPUs through NVML: name, memory, compute capability, PCI bus id, NUMA node, NVLink.

    Returns:
        (gpus, error): error is NVML's message when NVML or the driver is missing, else None.
    """
    try:
        import pynvml
    except ImportError as e:
        return (), f"nvidia-ml-py not installed ({e})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return (), str(e)
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        bus_ids = [sysfs_bus_id(_s(pynvml.nvmlDeviceGetPciInfo(h).busId)) for h in handles]
        gpus = tuple(_nvml_gpu(pynvml, i, h, bus_ids, root) for i, h in enumerate(handles))
        return gpus, None if gpus else "NVML found 0 devices"
    finally:
        pynvml.nvmlShutdown()


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_gpu(pynvml: Any, index: int, h: Any, bus_ids: list[str], root: str | Path) -> GpuInfo:
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
    links, peers, switch = _nvml_nvlinks(pynvml, h, bus_ids)
    return GpuInfo(
        index=index,
        name=_s(pynvml.nvmlDeviceGetName(h)),
        memory_gib=pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30,
        compute_capability=f"{major}.{minor}",
        pci_bus_id=bus_ids[index],
        numa_node=pci_numa_node(bus_ids[index], root),
        nvlink_links=links,
        nvlink_peers=peers,
        nvswitch=switch,
    )


def _nvml_nvlinks(pynvml: Any, h: Any, bus_ids: list[str]) -> tuple[int, tuple[int, ...], bool]:
    """Active NVLinks of one GPU: (count, peer GPU indices, ends at an NVSwitch)."""
    links, peers, switch = 0, set(), False
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = sysfs_bus_id(_s(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
        except pynvml.NVMLError:
            continue
        links += 1
        if remote in bus_ids:
            peers.add(bus_ids.index(remote))
        else:
            switch = True
    return links, tuple(sorted(peers)), switch


def probe(root: str | Path = "/", env: Mapping[str, str] | None = None) -> Topology:
    """Probe this machine: GPUs (NVML), NICs (sysfs), CPUs and memory (/proc), SLURM (env)."""
    gpus, gpu_error = probe_gpus(root)
    return Topology(
        source="probe",
        hostname=socket.gethostname(),
        gpus=gpus,
        nics=probe_nics(root),
        cpu=probe_cpu(root),
        host_memory_gib=probe_memory_gib(root),
        slurm=probe_slurm(os.environ if env is None else env),
        gpu_error=gpu_error,
    )
