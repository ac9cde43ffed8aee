"""Parse a saved `nvidia-smi topo -m` into a `Topology`.

The matrix has one header row naming devices (GPU0.., then NICs as `NIC#` or `mlx5_#`) followed
by attribute columns ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID"), then one row per device.
Cells are `X` (self), `NV#` (a bonded set of # NVLinks) or a PCIe path class: PIX, PXB, PHB,
NODE, SYS (older drivers: SOC, PSB). Drivers print it tab separated; copies pasted into issues
are often space separated; both are accepted. A `NIC Legend` maps `NIC#` to device names.

Anything else is reported as `UserError("<file>: line N: expected ..., got ...")`.
"""

from __future__ import annotations

import re

from llmctl.errors import UserError
from llmctl.topology.model import GpuInfo, NicInfo, Topology

ATTRIBUTES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
PCIE_CODES = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "PSB"})
_NV = re.compile(r"^NV(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


def parse_topo_matrix(text: str, source: str = "<text>") -> Topology:
    """Parse `nvidia-smi topo -m` output.

    Args:
        text: the saved output (prompt lines before the matrix are ignored).
        source: the file name, used in error messages and as `Topology.source`.

    Raises:
        UserError: no header row, a row with the wrong number of cells, an unknown cell.
    """
    lines = [_ANSI.sub("", line.rstrip("\r\n")) for line in text.splitlines()]
    start = _header_index(lines, source)
    devices, attributes = _parse_header(lines[start])
    rows: list[list[str]] = []
    attrs: list[dict[str, str]] = []
    for offset, device in enumerate(devices):
        lineno = start + 2 + offset
        line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
        cells, extra = _parse_row(line, device, len(devices), source, lineno)
        rows.append(cells)
        attrs.append(dict(zip(attributes, extra, strict=False)))
    names = _nic_legend(lines[start + 1 + len(devices) :])
    return _build(source, devices, rows, attrs, names)


def _header_index(lines: list[str], source: str) -> int:
    for i, line in enumerate(lines):
        if re.match(r"^\s*GPU0(\s|$)", line):
            return i
    raise UserError(
        f"{source}: line 1: expected an `nvidia-smi topo -m` header row starting with GPU0, "
        "found none in the file"
    )


def _parse_header(line: str) -> tuple[list[str], list[str]]:
    positions = sorted((line.find(a), a) for a in ATTRIBUTES if a in line)
    cut = positions[0][0] if positions else len(line)
    return line[:cut].split(), [a for _, a in positions]


def _parse_row(
    line: str, device: str, n: int, source: str, lineno: int
) -> tuple[list[str], list[str]]:
    """Split one matrix row into its n link cells and its attribute cells, checking each."""
    cells = [c.strip() for c in line.split("\t")] if "\t" in line else line.split()
    if not cells or cells[0] != device:
        got = f"{cells[0]!r}" if cells and cells[0] else "an empty line"
        raise UserError(f"{source}: line {lineno}: expected the row of {device}, got {got}")
    links = cells[1 : 1 + n]
    if len(links) < n or "" in links:
        raise UserError(
            f"{source}: line {lineno}: expected {n} link cells for {device}, got "
            f"{len([c for c in links if c])}"
        )
    for cell in links:
        if cell != "X" and cell not in PCIE_CODES and not _NV.match(cell):
            raise UserError(
                f"{source}: line {lineno}: expected X, NV# or one of "
                f"{', '.join(sorted(PCIE_CODES))} in the row of {device}, got {cell!r}"
            )
    return links, [c for c in cells[1 + n :] if c]


def _nic_legend(lines: list[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in lines if (m := _LEGEND.match(line))}


def _build(
    source: str,
    devices: list[str],
    rows: list[list[str]],
    attrs: list[dict[str, str]],
    names: dict[str, str],
) -> Topology:
    gpu_cols = [i for i, d in enumerate(devices) if re.fullmatch(r"GPU\d+", d)]
    gpus = tuple(_gpu(devices, i, rows[i], attrs[i], gpu_cols) for i in gpu_cols)
    nics = tuple(
        NicInfo(name=names.get(d, d)) for i, d in enumerate(devices) if i not in set(gpu_cols)
    )
    return Topology(
        source=source,
        gpus=gpus,
        nics=nics,
        devices=tuple(names.get(d, d) for d in devices),
        matrix=tuple(tuple(r) for r in rows),
    )


def _gpu(
    devices: list[str], i: int, row: list[str], attrs: dict[str, str], gpu_cols: list[int]
) -> GpuInfo:
    """One GPU row: NVLink peers and bond width (largest NV# to one peer), NUMA, CPU affinity."""
    counts = {int(devices[j][3:]): int(m.group(1)) for j in gpu_cols if (m := _NV.match(row[j]))}
    numa = attrs.get("NUMA Affinity", "")
    return GpuInfo(
        index=int(devices[i][3:]),
        numa_node=int(numa) if numa.isdigit() else None,
        cpu_affinity=attrs.get("CPU Affinity"),
        nvlink_links=max(counts.values(), default=0),
        nvlink_peers=tuple(sorted(counts)),
    )
