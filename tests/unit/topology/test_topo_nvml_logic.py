"""The NVML probe's own logic (bus ids, NVLink peers vs NVSwitch, NUMA) on a stand-in NVML.

NVML cannot run on this GPU-less machine, so a minimal stand-in module with NVML's function
names drives `probe_gpus`; `test_topo_gpu.py` checks the same code against the real NVML on a
GPU machine.
"""

import sys
import types
from pathlib import Path

import pytest

from llmctl.topology.probe import probe_gpus


class _Error(Exception):
    pass


def _fake_nvml(bus_ids: list[str], links: dict[int, list[str]], fail_init: bool = False):
    m = types.ModuleType("pynvml")
    m.NVMLError = _Error
    m.NVML_NVLINK_MAX_LINKS = 6
    m.NVML_FEATURE_ENABLED = 1

    def init() -> None:
        if fail_init:
            raise _Error("Driver Not Loaded")

    def link_state(h: int, link: int) -> int:
        if h >= 2 and link == 0:
            raise _Error("Not Supported")
        return 1 if link < len(links.get(h, [])) else 0

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(bus_ids)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus_ids[h].encode())
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=81559 * 2**20)
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=links[h][link])
    return m


def test_peers_switch_and_numa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    buses = ["00000000:1B:00.0", "00000000:43:00.0", "00000000:52:00.0", "00000000:61:00.0"]
    links = {
        0: ["00000000:43:00.0", "00000000:43:00.0"],  # GPU0 <-> GPU1 bridged, 2 links
        1: ["00000000:1B:00.0", "00000000:1B:00.0"],
        2: ["", "00000000:FF:00.0"],  # GPU2: link 0 unsupported, link 1 ends at a switch
    }
    numa = tmp_path / "sys/bus/pci/devices/0000:43:00.0/numa_node"
    numa.parent.mkdir(parents=True)
    numa.write_text("1\n")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(buses, links))
    gpus, error = probe_gpus(tmp_path)
    assert error is None and len(gpus) == 4
    assert [g.pci_bus_id for g in gpus][:2] == ["0000:1b:00.0", "0000:43:00.0"]
    assert [(g.nvlink_links, g.nvlink_peers, g.nvswitch) for g in gpus] == [
        (2, (1,), False),
        (2, (0,), False),
        (1, (), True),
        (0, (), False),
    ]
    assert gpus[1].numa_node == 1 and gpus[0].numa_node is None
    assert gpus[0].compute_capability == "9.0" and gpus[0].memory_gib == pytest.approx(79.65, 1e-3)


def test_nvml_init_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([], {}, fail_init=True))
    assert probe_gpus() == ((), "Driver Not Loaded")
