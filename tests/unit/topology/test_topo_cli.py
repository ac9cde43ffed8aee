"""`llmctl topo` through Typer's CliRunner: real probe, saved files, errors, --save round trip."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.errors import UserError
from llmctl.topology.probe import probe_gpus

runner = CliRunner()
NO_GPU = not probe_gpus()[0]


def _run(*args: str):
    return runner.invoke(app, ["topo", *args])


@pytest.mark.skipif(not NO_GPU, reason="this machine has an NVIDIA GPU")
def test_machine_without_gpu_says_so_and_reports_cpus() -> None:
    result = _run()
    assert result.exit_code == 0, result.output
    assert "no NVIDIA GPU found (NVML: " in result.output
    assert "CPUs: " in result.output and "Memory: " in result.output


def test_json_reports_cpus_memory_and_domain() -> None:
    result = _run("--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cpu"]["num_logical"] >= 1 and data["host_memory_gib"] > 0
    assert data["num_gpus"] == len(data["gpus"]) and data["nvlink_domain_size"] >= 1


def test_from_saved_topo_matrix(fixtures: Path) -> None:
    result = _run("--from", str(fixtures / "dgx_a100.txt"), "--json")
    data = json.loads(result.stdout)
    assert (data["num_gpus"], data["nvlink_domain_size"], len(data["nics"])) == (8, 8, 12)
    text = _run("--from", str(fixtures / "pcie_8x_rtx4090.txt")).output
    assert "NVLink domain: 1 GPU(s)" in text


def test_json_probe_round_trips_through_from(tmp_path: Path, fixtures: Path) -> None:
    first = _run("--from", str(fixtures / "dgx_h100.txt"), "--json").stdout
    saved = tmp_path / "probe.json"
    saved.write_text(first)
    assert json.loads(_run("--from", str(saved), "--json").stdout) == json.loads(first)
    live = tmp_path / "live.json"
    live.write_text(_run("--json").stdout)
    assert json.loads(_run("--from", str(live), "--json").stdout) == json.loads(live.read_text())


def _user_error(*args: str) -> UserError:
    """Invoke like the console script does (standalone_mode=False) and return the UserError."""
    result = runner.invoke(app, ["topo", *args], standalone_mode=False)
    assert isinstance(result.exception, UserError), result.output
    return result.exception


def test_malformed_file_is_one_line_user_error(tmp_path: Path, fixtures: Path) -> None:
    lines = (fixtures / "dgx_a100.txt").read_text().splitlines()
    lines[5] = lines[5].replace("NV12", "N12", 1)  # line 6: row of GPU3
    bad = tmp_path / "topo.txt"
    bad.write_text("\n".join(lines))
    error = _user_error("--from", str(bad))
    assert error.exit_code == 2 and "\n" not in error.message
    assert f"{bad}: line 6: expected X, NV#" in error.message and "'N12'" in error.message


def test_malformed_json_names_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "probe.json"
    bad.write_text('{"source": "probe",\n "gpus": [}\n')
    assert f"{bad}: line 2: expected JSON" in _user_error("--from", str(bad)).message
    bad.write_text('{"gpus": []}')
    assert f"{bad}: line 1: expected a topology object" in _user_error("--from", str(bad)).message


def test_console_script_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "topo.txt"
    bad.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV4\n")
    out = subprocess.run(
        [sys.executable, "-m", "llmctl", "topo", "--from", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (
        f"error: {bad}: line 3: expected the row of GPU1, got an empty line"
    )


def _cluster_config(path: Path):
    from omegaconf import OmegaConf

    from llmctl.config.schema import ClusterConfig

    loaded = yaml.safe_load(path.read_text())
    names = {f.name for f in dataclasses.fields(ClusterConfig)}
    assert set(loaded) == names
    merged = OmegaConf.merge(OmegaConf.structured(ClusterConfig), loaded)
    return OmegaConf.to_object(merged)


def test_save_this_machine_loads_as_cluster_config(tmp_path: Path) -> None:
    out = tmp_path / "cluster.yaml"
    result = _run("--save", str(out))
    assert result.exit_code == 0, result.output
    cfg = _cluster_config(out)
    assert cfg.num_nodes == 1 and cfg.cpu_cores >= 1 and cfg.host_memory_gib > 0
    if NO_GPU:
        assert (cfg.device, cfg.gpus_per_node) == ("cpu", 1)
        assert cfg.peak_tflops["fp32"] > 0 and cfg.hbm_bandwidth_gb_s > 0


def test_save_from_dgx_with_known_gpu(tmp_path: Path, fixtures: Path) -> None:
    out = tmp_path / "dgx.yaml"
    args = ("--from", str(fixtures / "dgx_h100.txt"), "--gpu", "h100_sxm", "--save", str(out))
    assert _run(*args).exit_code == 0
    cfg = _cluster_config(out)
    assert (cfg.device, cfg.gpus_per_node, cfg.nvlink_domain_size) == ("cuda", 8, 8)
    assert cfg.peak_tflops["bf16"] == 989.5 and cfg.nvlink_bandwidth_gb_s == 450.0


def test_save_unknown_gpu_keeps_facts_and_warns(tmp_path: Path, fixtures: Path) -> None:
    out = tmp_path / "pcie.yaml"
    result = _run("--from", str(fixtures / "pcie_8x_rtx4090.txt"), "--save", str(out))
    assert result.exit_code == 0
    assert "unknown GPU" in result.output
    cfg = _cluster_config(out)
    assert cfg.gpus_per_node == 8 and cfg.nvlink_domain_size == 1
    assert set(cfg.peak_tflops.values()) == {0.0}


def test_saved_files_compose_as_the_cluster_of_a_recipe(tmp_path: Path, fixtures: Path) -> None:
    from llmctl.config import compose

    local, dgx = tmp_path / "local.yaml", tmp_path / "dgx.yaml"
    assert _run("--save", str(local)).exit_code == 0
    args = ("--from", str(fixtures / "dgx_a100.txt"), "--gpu", "a100_80gb_sxm", "--save", str(dgx))
    assert _run(*args).exit_code == 0
    cfg = compose("tiny_cpu", [], cluster_file=str(local))
    assert cfg.cluster.name == yaml.safe_load(local.read_text())["name"]
    cfg = compose("tiny_cpu", [], cluster_file=str(dgx))
    assert (cfg.cluster.gpu_name, cfg.cluster.peak_tflops["bf16"]) == ("A100-SXM4-80GB", 312.0)


def test_unknown_gpu_option_lists_known_keys(tmp_path: Path, fixtures: Path) -> None:
    args = ("--from", str(fixtures / "dgx_a100.txt"), "--gpu", "a100_40gb", "--save", "x.yaml")
    message = _user_error(*args).message
    assert message.startswith("--gpu 'a100_40gb': not a known GPU; expected one of a100_80gb_sxm")


def test_out_never_replaces_a_file_topo_did_not_write(tmp_path: Path) -> None:
    notes = tmp_path / "notes.yaml"
    notes.write_text("my own cluster notes\n")
    assert "exists; pass --force" in _user_error("-o", str(notes)).message
    assert "was not written by llmctl" in _user_error("-o", str(notes), "--force").message
    assert notes.read_text() == "my own cluster notes\n"
    own = tmp_path / "cluster.yaml"
    assert _run("-o", str(own)).exit_code == 0
    assert "exists; pass --force" in _user_error("-o", str(own)).message
    own.write_text(own.read_text() + "# edited\n")
    assert _run("-o", str(own), "--force").exit_code == 0
    assert "# edited" not in own.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "notes.yaml"]


def test_out_that_cannot_be_written_is_one_line_before_any_probe(tmp_path: Path) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "llmctl", "topo", "-o", str(folder)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")
    expected = f"error: {folder} is a folder; topo --out writes a cluster YAML file there\n"
    assert out.stderr == expected
    blocker = tmp_path / "file"
    blocker.write_text("x")
    message = _user_error("-o", str(blocker / "c.yaml")).message
    assert message == f"cannot write {blocker / 'c.yaml'}: {blocker} is a file, not a folder"
    assert list(folder.iterdir()) == [] and blocker.read_text() == "x"


def test_unknown_gpu_is_refused_whatever_the_source(tmp_path: Path) -> None:
    out = tmp_path / "c.yaml"
    assert _user_error("--gpu", "h999", "-o", str(out)).message.startswith("--gpu 'h999': not")
    assert not out.exists()


def test_plan_on_an_unknown_gpu_file_names_the_zero_to_fill_in(
    tmp_path: Path, fixtures: Path
) -> None:
    """`topo --out` of an unknown GPU writes zeros; planning on it is one line, not a crash."""
    out = tmp_path / "pcie.yaml"
    assert _run("--from", str(fixtures / "pcie_8x_rtx4090.txt"), "-o", str(out)).exit_code == 0
    result = runner.invoke(
        app, ["plan", "recipe=tiny_cpu", "--cluster-file", str(out)], standalone_mode=False
    )
    assert isinstance(result.exception, UserError), result.output
    assert result.exception.message.startswith("cluster.hbm_gib must be > 0, got 0.0 (cluster ")
    text = out.read_text().replace("hbm_gib: 0.0", "hbm_gib: 24.0")
    out.write_text(text.replace("hbm_bandwidth_gb_s: 0.0", "hbm_bandwidth_gb_s: 1008.0"))
    result = runner.invoke(
        app, ["plan", "recipe=tiny_cpu", "--cluster-file", str(out)], standalone_mode=False
    )
    assert isinstance(result.exception, UserError), result.output
    assert result.exception.message.startswith("cluster.peak_tflops.")
