"""`llmctl topo`: what this machine (or a saved probe) offers: GPUs, NVLink, NICs, CPUs, memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from llmctl.topology import Topology, describe, save_cluster, to_dict
from llmctl.topology.cluster import check_cluster_out
from llmctl.topology.gpus import KNOWN_GPUS

_GPU_KEYS = tuple(g.key for g in KNOWN_GPUS)


def topo(
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from", help="Read a saved `nvidia-smi topo -m` text or `llmctl topo --json` file."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Write a cluster description YAML that `plan --cluster-file` reads."
        ),
    ] = None,
    save: Annotated[Path | None, typer.Option("--save", hidden=True)] = None,  # old spelling
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help=f"Known GPU when the source names none: {', '.join(_GPU_KEYS)}.",
            autocompletion=lambda: list(_GPU_KEYS),
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a cluster file an earlier `topo --out` wrote.")
    ] = False,
) -> None:
    """Probe GPUs (NVML), NVLink, PCIe/NUMA, RDMA NICs, CPUs, memory and the SLURM job."""
    save = out or save
    if save is not None:
        check_cluster_out(save, force)
    topology = describe(from_file)
    warnings = save_cluster(topology, save, gpu) if save is not None else []
    if as_json:
        typer.echo(json.dumps(to_dict(topology), indent=2))
        for w in warnings:
            typer.echo(f"warning: {w}", err=True)
        return
    _render(Console(), topology, save, warnings)


def _render(console: Console, t: Topology, save: Path | None, warnings: list[str]) -> None:
    console.print(f"[bold]Topology[/bold] of {t.hostname or t.source} (source: {t.source})")
    if t.gpus:
        console.print(_gpu_table(t))
        console.print(f"NVLink domain: {t.nvlink_domain_size} GPU(s)")
    else:
        reason = f" (NVML: {t.gpu_error})" if t.gpu_error else ""
        console.print(f"no NVIDIA GPU found{reason}")
    if t.nics:
        console.print(_nic_table(t))
    if t.cpu is not None:
        cores = f", {t.cpu.num_physical_cores} cores" if t.cpu.num_physical_cores else ""
        console.print(f"CPUs: {t.cpu.num_logical} logical{cores}, {t.cpu.model}")
    if t.host_memory_gib is not None:
        console.print(f"Memory: {t.host_memory_gib:.1f} GiB")
    if t.slurm is not None:
        nodes = ",".join(t.slurm.nodes) or "?"
        console.print(f"SLURM job {t.slurm.job_id}: {t.slurm.num_nodes} node(s): {nodes}")
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if save is not None:
        console.print(f"cluster description written to {save}")


def _gpu_table(t: Topology) -> Table:
    table = Table("GPU", "name", "memory GiB", "CC", "PCI bus", "NUMA", "CPUs", "NVLink peers")
    for g in t.gpus:
        peers = ",".join(map(str, g.nvlink_peers)) or ("NVSwitch" if g.nvswitch else "-")
        mem = f"{g.memory_gib:.1f}" if g.memory_gib is not None else "?"
        numa = str(g.numa_node) if g.numa_node is not None else "?"
        table.add_row(
            str(g.index), g.name or "?", mem, g.compute_capability or "?", g.pci_bus_id or "?",
            numa, g.cpu_affinity or "?", peers,
        )  # fmt: skip
    return table


def _nic_table(t: Topology) -> Table:
    table = Table("NIC", "port", "rate Gb/s", "link layer", "state")
    for n in t.nics:
        rate = f"{n.rate_gbps:g}" if n.rate_gbps is not None else "?"
        table.add_row(n.name, str(n.port or "?"), rate, n.link_layer or "?", n.state or "?")
    return table
