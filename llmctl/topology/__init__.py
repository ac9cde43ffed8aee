"""Topology: probe real hardware (NVML, sysfs, /proc, SLURM) into frozen values, parse saved
`nvidia-smi topo -m` outputs, and describe the result as a cluster config.

Importing this package imports no NVML: `pynvml` is imported inside `probe_gpus`.
"""

from llmctl.topology.cluster import cluster_description, save_cluster
from llmctl.topology.gpus import KNOWN_GPUS, KnownGpu, match_gpu
from llmctl.topology.load import describe, load_topology
from llmctl.topology.model import (
    CpuInfo,
    GpuInfo,
    NicInfo,
    SlurmInfo,
    Topology,
    to_dict,
    topology_from_dict,
)
from llmctl.topology.probe import probe
from llmctl.topology.slurm import expand_nodelist, probe_slurm
from llmctl.topology.smi import parse_topo_matrix

__all__ = [
    "KNOWN_GPUS",
    "CpuInfo",
    "GpuInfo",
    "KnownGpu",
    "NicInfo",
    "SlurmInfo",
    "Topology",
    "cluster_description",
    "describe",
    "expand_nodelist",
    "load_topology",
    "match_gpu",
    "parse_topo_matrix",
    "probe",
    "probe_slurm",
    "save_cluster",
    "to_dict",
    "topology_from_dict",
]
