"""On a machine with NVIDIA GPUs: the NVML probe agrees with `nvidia-smi` (skipped elsewhere)."""

import shutil
import subprocess

import pytest

from llmctl.topology import match_gpu, parse_topo_matrix
from llmctl.topology.probe import probe_gpus, sysfs_bus_id

GPUS, ERROR = probe_gpus()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPUS or shutil.which("nvidia-smi") is None, reason=f"no GPU: {ERROR}"),
]


def _smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


def test_nvml_probe_matches_nvidia_smi_query() -> None:
    rows = _smi("--query-gpu=name,memory.total,pci.bus_id,compute_cap", "--format=csv,noheader")
    expected = [[c.strip() for c in row.split(",")] for row in rows.strip().splitlines()]
    assert len(GPUS) == len(expected)
    for gpu, (name, memory, bus, cap) in zip(GPUS, expected, strict=True):
        assert gpu.name == name and gpu.compute_capability == cap
        assert gpu.pci_bus_id == sysfs_bus_id(bus)
        assert gpu.memory_gib == pytest.approx(float(memory.split()[0]) / 1024, rel=1e-3)


def test_nvml_nvlink_domain_matches_topo_matrix() -> None:
    from llmctl.topology import probe

    parsed = parse_topo_matrix(_smi("topo", "-m"), "nvidia-smi topo -m")
    assert parsed.num_gpus == len(GPUS)
    assert probe(env={}).nvlink_domain_size == parsed.nvlink_domain_size


def test_datacentre_gpu_is_in_the_table() -> None:
    if not any(k in GPUS[0].name for k in ("A100-SXM4-80GB", "H100 80GB HBM3", "H200", "B200")):
        pytest.skip(f"{GPUS[0].name} is not one of the tabled SXM parts")
    assert match_gpu(GPUS[0].name) is not None
