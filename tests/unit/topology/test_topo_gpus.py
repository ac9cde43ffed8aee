"""The known-GPU table: name matching and datasheet structure."""

from pathlib import Path

import pytest

from llmctl.topology import KNOWN_GPUS, match_gpu


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100_80gb_sxm"),
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("NVIDIA H200", "h200_sxm"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("h100_sxm", "h100_sxm"),
    ],
)
def test_nvml_names_match(name: str, key: str) -> None:
    gpu = match_gpu(name)
    assert gpu is not None and gpu.key == key


@pytest.mark.parametrize(
    "name",
    ["NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
     "NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB"],
)  # fmt: skip
def test_other_variants_do_not_match(name: str) -> None:
    assert match_gpu(name) is None


@pytest.mark.parametrize("gpu", KNOWN_GPUS, ids=lambda g: g.key)
def test_dense_rates_follow_the_tensor_core_ladder(gpu) -> None:
    peaks = gpu.peak_tflops
    assert peaks["bf16"] == peaks["fp16"]
    assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.03)
    assert peaks["fp32"] < peaks["tf32"]
    if "fp8" in peaks:
        assert peaks["fp8"] == 2 * peaks["bf16"]
    if "fp4" in peaks:
        assert peaks["fp4"] == 2 * peaks["fp8"]
    assert gpu.nvlink_bandwidth_gb_s * 2 in (600.0, 900.0, 1800.0)


@pytest.mark.parametrize(
    ("gpu", "fixture", "cluster"),
    [
        ("a100_80gb_sxm", "dgx_a100.txt", "dgx_a100_80gb"),
        ("h100_sxm", "dgx_h100.txt", "dgx_h100"),
        ("h200_sxm", "dgx_h100.txt", "dgx_h200"),
    ],
)
def test_fitted_knobs_equal_the_shipped_cluster_files(
    gpu: str, fixture: str, cluster: str, fixtures: Path
) -> None:
    """`topo --out` of a DGX writes the fitted step-time knobs of configs/cluster/dgx_*.yaml."""
    from llmctl.config import compose
    from llmctl.topology import cluster_description, load_topology

    desc, _ = cluster_description(load_topology(fixtures / fixture), gpu=gpu)
    cfg = compose("tiny_cpu", [f"cluster={cluster}"]).cluster
    assert desc["achievable_fraction"] == dict(cfg.achievable_fraction)
    assert desc["efficiency"] == dict(cfg.efficiency)
