"""Parsing real published `nvidia-smi topo -m` outputs, and rejecting broken ones."""

from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.topology import load_topology, parse_topo_matrix


@pytest.mark.parametrize(
    ("name", "num_gpus", "num_nics", "domain", "bond"),
    [
        ("dgx_a100.txt", 8, 12, 8, 12),
        ("dgx_h100.txt", 8, 12, 8, 18),
        ("pcie_8x_rtx4090.txt", 8, 2, 1, 0),
        ("hgx_a100_4gpu_spaces.txt", 4, 4, 4, 4),
    ],
)
def test_fixture_counts_and_nvlink_domain(
    fixtures: Path, name: str, num_gpus: int, num_nics: int, domain: int, bond: int
) -> None:
    topo = load_topology(fixtures / name)
    assert topo.num_gpus == num_gpus
    assert len(topo.nics) == num_nics
    assert topo.nvlink_domain_size == domain
    assert {g.nvlink_links for g in topo.gpus} == {bond}
    assert [g.index for g in topo.gpus] == list(range(num_gpus))


def test_dgx_a100_numa_and_affinity(fixtures: Path) -> None:
    topo = load_topology(fixtures / "dgx_a100.txt")
    assert [g.numa_node for g in topo.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert topo.gpus[4].cpu_affinity == "112-127,240-255"
    assert topo.nics[10].name == "mlx5_10"
    assert topo.matrix[0][8] == "PXB"  # GPU0 to mlx5_0 shares a PCIe switch


def test_dgx_h100_nic_legend_names_nics(fixtures: Path) -> None:
    topo = load_topology(fixtures / "dgx_h100.txt")
    assert [n.name for n in topo.nics] == [f"mlx5_{i}" for i in range(12)]
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.devices[8] == "mlx5_0"


def test_pcie_box_has_no_nvlink_peers(fixtures: Path) -> None:
    topo = load_topology(fixtures / "pcie_8x_rtx4090.txt")
    assert all(g.nvlink_peers == () for g in topo.gpus)
    assert topo.matrix[6][8] == "PHB"


def test_nvlink_pairs_give_domain_of_two() -> None:
    # A PCIe box whose GPUs are bridged in pairs: built from the 4-GPU fixture by cutting links.
    text = (
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
        "GPU0\t X \tNV4\tSYS\tSYS\t0-15\n"
        "GPU1\tNV4\t X \tSYS\tSYS\t0-15\n"
        "GPU2\tSYS\tSYS\t X \tNV4\t16-31\n"
        "GPU3\tSYS\tSYS\tNV4\t X \t16-31\n"
    )
    assert parse_topo_matrix(text, "pairs").nvlink_domain_size == 2


def _broken(fixtures: Path, tmp_path: Path, lineno: int, edit) -> Path:
    lines = (fixtures / "dgx_h100.txt").read_text().splitlines()
    lines[lineno - 1] = edit(lines[lineno - 1])
    path = tmp_path / "broken.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_truncated_row_names_file_line_and_expectation(fixtures: Path, tmp_path: Path) -> None:
    path = _broken(fixtures, tmp_path, 4, lambda line: "\t".join(line.split("\t")[:5]))
    with pytest.raises(UserError, match=r"broken\.txt: line 4: expected 20 link cells for GPU2"):
        load_topology(path)


def test_unknown_cell_is_reported(fixtures: Path, tmp_path: Path) -> None:
    path = _broken(fixtures, tmp_path, 9, lambda line: line.replace("NV18", "NVX", 1))
    with pytest.raises(
        UserError, match=r"line 9: expected X, NV# .* in the row of GPU7, got 'NVX'"
    ):
        load_topology(path)


def test_missing_row_is_reported(fixtures: Path, tmp_path: Path) -> None:
    path = _broken(fixtures, tmp_path, 21, lambda line: "")
    with pytest.raises(UserError, match=r"line 21: expected the row of NIC11, got an empty line"):
        load_topology(path)


def test_file_without_header(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("Failed to initialize NVML: Driver/library version mismatch\n")
    with pytest.raises(UserError, match=r"notes\.txt: line 1: expected .* header row .* GPU0"):
        load_topology(path)
