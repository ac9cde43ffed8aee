"""Known data-centre GPUs: dense peak TFLOP/s per dtype, HBM size and bandwidth, NVLink bandwidth.

Why these numbers: the planner turns FLOPs into time with `peak_tflops * achievable_fraction`
and bytes into time with bandwidths, so each figure is the vendor datasheet value, not a
measurement. NVIDIA datasheets quote Tensor Core rates "with sparsity" (2:4); the dense rates
here are those divided by two, which is what dense training GEMMs can reach. NVLink is quoted
as a bidirectional total per GPU; `nvlink_bandwidth_gb_s` is one direction (half of it), the
convention of ClusterConfig. Sources per entry are listed in docs/topology.md.

`match_gpu` maps an NVML device name ("NVIDIA H100 80GB HBM3") or a short key ("h100_sxm") to an
entry; PCIe/NVL variants (different clocks, memory and links) deliberately do not match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownGpu:
    """Datasheet facts for one GPU model (one SXM/superchip variant)."""

    key: str
    gpu_name: str
    pattern: str
    compute_capability: str
    peak_tflops: dict[str, float] = field(default_factory=dict)
    hbm_gib: float
    hbm_bandwidth_gb_s: float
    nvlink_bandwidth_gb_s: float
    nvlink_domain_size: int
    sm_count: int
    source: str


KNOWN_GPUS: tuple[KnownGpu, ...] = (
    KnownGpu(
        key="a100_80gb_sxm",
        gpu_name="A100-SXM4-80GB",
        pattern=r"a100.*sxm.*80",
        compute_capability="8.0",
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        hbm_gib=80.0,
        hbm_bandwidth_gb_s=2039.0,
        nvlink_bandwidth_gb_s=300.0,
        nvlink_domain_size=8,
        sm_count=108,
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)",
    ),
    KnownGpu(
        key="h100_sxm",
        gpu_name="H100-SXM5-80GB",
        pattern=r"h100.*(sxm|hbm3)",
        compute_capability="9.0",
        peak_tflops={"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        hbm_gib=80.0,
        hbm_bandwidth_gb_s=3350.0,
        nvlink_bandwidth_gb_s=450.0,
        nvlink_domain_size=8,
        sm_count=132,
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)",
    ),
    KnownGpu(
        key="h200_sxm",
        gpu_name="H200-SXM-141GB",
        pattern=r"h200(?!.*nvl)",
        compute_capability="9.0",
        peak_tflops={"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
        hbm_gib=141.0,
        hbm_bandwidth_gb_s=4800.0,
        nvlink_bandwidth_gb_s=450.0,
        nvlink_domain_size=8,
        sm_count=132,
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)",
    ),
    KnownGpu(
        key="b200",
        gpu_name="B200-180GB",
        pattern=r"(?<!g)b200",
        compute_capability="10.0",
        peak_tflops={
            "fp32": 75.0,
            "tf32": 1100.0,
            "bf16": 2250.0,
            "fp16": 2250.0,
            "fp8": 4500.0,
            "fp4": 9000.0,
        },
        hbm_gib=180.0,
        hbm_bandwidth_gb_s=7700.0,
        nvlink_bandwidth_gb_s=900.0,
        nvlink_domain_size=8,
        sm_count=148,
        source="NVIDIA HGX B200 specifications (individual Blackwell GPU, HGX B200 column)",
    ),
    KnownGpu(
        key="gb200",
        gpu_name="GB200-186GB",
        pattern=r"gb200",
        compute_capability="10.0",
        peak_tflops={
            "fp32": 80.0,
            "tf32": 1250.0,
            "bf16": 2500.0,
            "fp16": 2500.0,
            "fp8": 5000.0,
            "fp4": 10000.0,
        },
        hbm_gib=186.0,
        hbm_bandwidth_gb_s=8000.0,
        nvlink_bandwidth_gb_s=900.0,
        nvlink_domain_size=72,
        sm_count=148,
        source="NVIDIA GB200 NVL72 specifications (individual Blackwell GPU, GB200 column)",
    ),
)

BY_KEY = MappingProxyType({g.key: g for g in KNOWN_GPUS})


def match_gpu(name: str) -> KnownGpu | None:
    """The table entry for an NVML name or a table key; None for an unknown GPU.

    Args:
        name: e.g. "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "h200_sxm".
    """
    text = name.strip().lower()
    if text in BY_KEY:
        return BY_KEY[text]
    text = text.replace("nvidia", "").replace("_", " ")
    return next((g for g in KNOWN_GPUS if re.search(g.pattern, text)), None)
