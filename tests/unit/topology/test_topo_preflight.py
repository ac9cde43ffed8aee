"""The job-start preflight comparison on saved real `nvidia-smi topo -m` outputs and live-like
probes (tests/fixtures/topology/SOURCE.md names each file's origin)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from llmctl.config import compose
from llmctl.topology.load import load_topology
from llmctl.topology.model import GpuInfo, NicInfo
from llmctl.topology.preflight import expected_from_cluster, mismatches, refusal

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topology"


def _expected(cluster: str, nodes: int = 8):  # type: ignore[no-untyped-def]
    cfg = compose("llama3_70b_pretrain_64gpu_h100_fp8", [f"cluster={cluster}"])
    return replace(expected_from_cluster(cfg.cluster), num_nodes=nodes)


def test_matching_nodes_pass() -> None:
    assert mismatches(_expected("dgx_h100"), load_topology(FIX / "dgx_h100.txt")) == []
    assert mismatches(_expected("dgx_a100_80gb"), load_topology(FIX / "dgx_a100.txt")) == []


def test_pcie_node_without_nvlink_is_refused() -> None:
    found = mismatches(_expected("dgx_h100"), load_topology(FIX / "pcie_8x_rtx4090.txt"))
    assert found == [
        "NVLink domain of 1 GPU(s), the plan assumes 8 (tensor parallelism would cross PCIe)"
    ]


def test_four_gpu_node_is_refused_in_one_line() -> None:
    nodes = {
        "n1": load_topology(FIX / "dgx_a100.txt"),
        "n2": load_topology(FIX / "hgx_a100_4gpu_spaces.txt"),
    }
    line = refusal(_expected("dgx_a100_80gb"), nodes)
    assert line is not None and "\n" not in line
    assert line.startswith("hardware differs from the plan on n2: 4 GPUs, the plan assumes 8")


def test_probed_model_memory_and_nic_rate_are_compared() -> None:
    topo = load_topology(FIX / "dgx_h100.txt")
    a100 = tuple(replace(g, name="NVIDIA A100-SXM4-40GB", memory_gib=39.4) for g in topo.gpus)
    slow = tuple(NicInfo(name=f"mlx5_{i}", rate_gbps=100.0, state="ACTIVE") for i in range(8))
    found = mismatches(_expected("dgx_h100"), replace(topo, gpus=a100, nics=slow))
    assert any(m.startswith("GPU 'NVIDIA A100-SXM4-40GB'") for m in found)
    assert "39.4 GiB per GPU, the plan assumes 79.6 GiB" in found
    assert "RDMA 12.5 GB/s per GPU, the plan assumes 50 GB/s" in found
    h100 = tuple(replace(g, name="NVIDIA H100 80GB HBM3", memory_gib=79.6) for g in topo.gpus)
    assert mismatches(_expected("dgx_h100"), replace(topo, gpus=h100)) == []


def test_gpu_less_node_is_refused() -> None:
    topo = load_topology(FIX / "dgx_h100.txt")
    empty = replace(topo, gpus=(), gpu_error="NVML Shared Library Not Found")
    assert mismatches(_expected("dgx_h100"), empty) == [
        "no NVIDIA GPU (NVML Shared Library Not Found); the plan assumes GPUs"
    ]
    assert GpuInfo(index=0).name == ""


def test_sbatch_runs_the_preflight_on_every_node_before_torchrun(tmp_path: Path) -> None:
    from llmctl.launch.slurm import render_sbatch

    layout = ["parallel.tp=4", "parallel.pp=8", "parallel.dp=2", "parallel.micro_batch_size=1"]
    cfg = compose("llama3_70b_pretrain_64gpu_h100_fp8", ["launcher=slurm", *layout])
    script = render_sbatch(cfg, tmp_path)
    pre = script.index("-m llmctl.topology.preflight")
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1' in script[:pre]
    assert pre < script.index("torch.distributed.run")
    cpu = render_sbatch(compose("tiny_cpu", ["launcher=slurm"]), tmp_path)
    assert "llmctl.topology.preflight" not in cpu  # nothing to compare on a CPU cluster


def test_preflight_on_this_gpu_less_host_refuses_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from llmctl.config.compose import cfg_to_yaml
    from llmctl.topology.probe import probe

    if probe().gpus:
        return  # a GPU host: the comparison above covers it
    (tmp_path / "config.yaml").write_text(
        cfg_to_yaml(compose("llama3_70b_pretrain_64gpu_h100_fp8", []))
    )
    proc = subprocess.run(
        [sys.executable, "-m", "llmctl.topology.preflight", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmctl: hardware differs from the plan on ")
    assert "no NVIDIA GPU" in lines[0]


def test_ssh_launcher_judges_each_hosts_probe_answer() -> None:
    import json

    import pytest

    from llmctl.errors import UserError
    from llmctl.launch.torchrun import render_hardware_probe
    from llmctl.topology.model import to_dict
    from llmctl.topology.preflight import hosts_refusal

    cfg = compose("llama3_70b_pretrain_64gpu_h100_fp8", ["launcher=torchrun"])
    argv = render_hardware_probe(cfg, "n1", "/venv/bin/python")
    assert argv[-2:] == ["n1", "/venv/bin/python -m llmctl.topology.preflight --probe"]
    h100 = json.dumps(to_dict(load_topology(FIX / "dgx_h100.txt")))
    pcie = json.dumps(to_dict(load_topology(FIX / "pcie_8x_rtx4090.txt")))
    assert hosts_refusal(cfg.cluster, {"n0": h100, "n1": h100}) is None
    line = hosts_refusal(cfg.cluster, {"n0": h100, "n1": pcie})
    assert line is not None and "\n" not in line
    assert line.startswith("hardware differs from the plan on n1: NVLink domain of 1 GPU(s)")
    with pytest.raises(UserError, match=r"^host n1: the hardware probe"):
        hosts_refusal(cfg.cluster, {"n0": h100, "n1": "bash: python: command not found"})
