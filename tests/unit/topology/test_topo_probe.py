"""Probes: the real machine (CPUs, memory, NVML) and fake sysfs/procfs trees for the parsers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmctl.topology import cluster_description, probe
from llmctl.topology.cluster import cpu_peak_tflops
from llmctl.topology.probe import (
    pci_numa_node,
    probe_cpu,
    probe_gpus,
    probe_memory_gib,
    probe_nics,
    sysfs_bus_id,
)


def test_real_cpu_and_memory_match_the_kernel() -> None:
    cpu = probe_cpu()
    assert cpu.num_logical == os.cpu_count()
    assert cpu.model and cpu.model != "unknown"
    phys_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert probe_memory_gib() == pytest.approx(phys_gib, rel=0.01)


def test_real_probe_reports_gpus_or_why_not() -> None:
    gpus, error = probe_gpus()
    assert bool(gpus) != bool(error)
    for g in gpus:  # only on a GPU machine
        assert g.memory_gib and g.memory_gib > 1 and g.compute_capability and g.name


def test_real_probe_outside_slurm_has_one_node() -> None:
    topo = probe(env={})
    assert topo.slurm is None and topo.num_nodes == 1
    assert topo.cpu is not None and topo.host_memory_gib


def test_import_does_not_load_nvml() -> None:
    code = "import sys, llmctl.topology, llmctl.cli.main; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _port(root: Path, dev: str, port: int, rate: str, layer: str, state: str) -> None:
    base = root / "sys/class/infiniband" / dev / "ports" / str(port)
    _write(base / "rate", rate)
    _write(base / "link_layer", layer)
    _write(base / "state", state)


def test_fake_sysfs_infiniband_and_roce_ports(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, "400 Gb/sec (4X NDR)", "InfiniBand", "4: ACTIVE")
    _port(tmp_path, "mlx5_1", 1, "200 Gb/sec (4X HDR)", "InfiniBand", "1: DOWN")
    _port(tmp_path, "mlx5_2", 1, "100 Gb/sec (4X EDR)", "Ethernet", "4: ACTIVE")
    _write(tmp_path / "sys/class/infiniband/mlx5_0/device/numa_node", "1")
    nics = probe_nics(tmp_path)
    assert [(n.name, n.port, n.rate_gbps, n.link_layer) for n in nics] == [
        ("mlx5_0", 1, 400.0, "InfiniBand"),
        ("mlx5_1", 1, 200.0, "InfiniBand"),
        ("mlx5_2", 1, 100.0, "Ethernet"),
    ]
    assert [n.active for n in nics] == [True, False, True]
    assert nics[0].numa_node == 1 and nics[1].numa_node is None


def test_no_infiniband_class_means_no_nics(tmp_path: Path) -> None:
    assert probe_nics(tmp_path) == ()


def test_internode_bandwidth_sums_active_ports_per_gpu(tmp_path: Path, fixtures: Path) -> None:
    from dataclasses import replace

    from llmctl.topology import load_topology

    for i in range(8):
        _port(tmp_path, f"mlx5_{i}", 1, "400 Gb/sec (4X NDR)", "InfiniBand", "4: ACTIVE")
    _port(tmp_path, "mlx5_8", 1, "400 Gb/sec (4X NDR)", "InfiniBand", "1: DOWN")
    topo = replace(load_topology(fixtures / "dgx_h100.txt"), nics=probe_nics(tmp_path))
    desc, warnings = cluster_description(topo, gpu="h100_sxm")
    assert desc["internode_bandwidth_gb_s"] == pytest.approx(8 * 400 / 8 / 8)  # 50 GB/s/GPU
    assert desc["internode_latency_us"] == 5.0 and warnings == []


def test_pci_numa_node_and_bus_id(tmp_path: Path) -> None:
    assert sysfs_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    _write(tmp_path / "sys/bus/pci/devices/0000:1b:00.0/numa_node", "1")
    _write(tmp_path / "sys/bus/pci/devices/0000:43:00.0/numa_node", "-1")
    assert pci_numa_node("0000:1b:00.0", tmp_path) == 1
    assert pci_numa_node("0000:43:00.0", tmp_path) is None
    assert pci_numa_node("0000:99:00.0", tmp_path) is None


CPUINFO_BLOCK = """processor\t: {n}
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: {socket}
core id\t\t: {core}
cpu MHz\t\t: 2000.000
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512_bf16
"""


def test_fake_cpuinfo_counts_and_peak(tmp_path: Path) -> None:
    # 2 sockets x 2 cores x 2 hyperthreads = 8 logical CPUs, 4 physical cores.
    blocks = [CPUINFO_BLOCK.format(n=n, socket=n // 4, core=(n // 2) % 2) for n in range(8)]
    _write(tmp_path / "proc/cpuinfo", "\n".join(blocks))
    _write(tmp_path / "proc/meminfo", "MemTotal:       16777216 kB\nMemFree: 1 kB")
    cpu = probe_cpu(tmp_path)
    assert (cpu.num_logical, cpu.num_physical_cores) == (8, 4)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+"
    # 4 cores x 2.0 GHz x (2 FMA pipes x 16 lanes x 2 FLOP) = 0.512 TFLOP/s; bf16 dot = 2x.
    assert cpu_peak_tflops(cpu) == {"fp32": 0.512, "bf16": 1.024}
    assert probe_memory_gib(tmp_path) == 16.0
