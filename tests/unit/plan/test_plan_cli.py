"""`llmctl plan` through Typer's CliRunner, and every shipped recipe planned on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.config import compose, list_recipes
from llmctl.config.planning import plan_config

runner = CliRunner()
R70 = "recipe=llama3_70b_pretrain_64gpu_h100_fp8"


def test_table_rejections_and_time_to_train() -> None:
    res = runner.invoke(app, ["plan", R70])
    assert res.exit_code == 0, res.output
    assert "Fastest layouts that fit" in res.output
    assert "TP=16 does not divide 8 query groups" in res.output
    assert "Time to train" in res.output


def test_json_and_fixed_dims() -> None:
    res = runner.invoke(app, ["plan", R70, "--tp", "4", "--pp", "8", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["world_size"] == 64 and data["ranked"]
    assert {(r["layout"]["tp"], r["layout"]["pp"]) for r in data["ranked"]} == {(4, 8)}
    best = data["ranked"][0]
    assert best["fits"] and best["memory_gib"]["total"] <= data["usable_gib"]
    assert best["time_s"]["total"] == pytest.approx(best["step_s"])


def test_explain_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    res = runner.invoke(app, ["plan", R70, "--explain", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "Memory of the worst rank" in res.output and "bubble" in res.output
    assert f"plot written to {png}" in res.output
    assert "Published layout TP4 PP8 VPP5" in res.output and "faster per step" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_output_fits_80_columns_and_has_no_legend_when_piped() -> None:
    res = runner.invoke(app, ["plan", R70, "--explain"], terminal_width=80)
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "fp8_buffers" not in res.output.split("Explain")[0]  # the colour legend


def test_impossible_layout_is_a_one_line_user_error() -> None:
    res = runner.invoke(app, ["plan", R70, "--tp", "8", "--pp", "3"])
    assert res.exit_code == 2
    assert "64 GPUs not divisible by TP*PP*CP = 8*3*1" in res.output
    assert "Traceback" not in res.output


def test_nothing_fits_says_what_would() -> None:
    res = runner.invoke(app, ["plan", R70, "--nodes", "1", "--tp", "1", "--pp", "1", "--cp", "1"])
    assert res.exit_code == 0, res.output
    assert "Nothing fits" in res.output and "nodes" in res.output


def test_calibrate_names_the_missing_file(tmp_path: Path) -> None:
    bad = runner.invoke(app, ["plan", R70, "--calibrate", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "no perf.json in" in bad.output
    assert "Traceback" not in bad.output


@pytest.mark.parametrize("where", ["folder", "under_file", "exists", "not_ours_forced"])
def test_calibrate_out_that_cannot_be_written_is_one_line(
    tmp_path: Path, where: str, run_main
) -> None:
    """-o a folder, a path under a file, or a file that is there: one line, rc 2, before any
    run is read (the run dir here is missing), and the file in the way is left as it was."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    (tmp_path / "adir").mkdir()
    out = {
        "folder": tmp_path / "adir",
        "under_file": notes / "c.yaml",
        "exists": notes,
        "not_ours_forced": notes,
    }[where]
    force = ["--force"] if where == "not_ours_forced" else []
    args = ["plan", R70, "--calibrate", str(tmp_path / "missing"), "-o", str(out), *force]
    code, stdout, stderr = run_main(args)
    assert code == 2 and stdout == "", stderr
    assert len(stderr.strip().splitlines()) == 1 and str(out) in stderr, stderr
    assert "no perf.json" not in stderr and "Traceback" not in stderr
    assert notes.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "notes.txt"]
    assert not any((tmp_path / "adir").iterdir())


def test_calibrated_file_is_replaced_only_with_force(tmp_path: Path) -> None:
    from llmctl.config.planning import CALIBRATED_HEADER, save_calibrated
    from llmctl.errors import UserError

    out = tmp_path / "c.yaml"
    save_calibrated(out, f"{CALIBRATED_HEADER}\nname: a\n")
    with pytest.raises(UserError, match="exists; pass --force"):
        save_calibrated(out, f"{CALIBRATED_HEADER}\nname: b\n")
    save_calibrated(out, f"{CALIBRATED_HEADER}\nname: b\n", force=True)
    assert out.read_text().endswith("name: b\n")
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


PLANNING_RECIPES = [
    "llama3_8b_pretrain_8gpu_h100_fp8",
    "llama3_70b_pretrain_64gpu_h100_fp8",
    "llama31_405b_pretrain_1024gpu_h100_fp8",
    "gpt3_175b_pretrain_64gpu_a100_bf16",
    "megatron_22b_pretrain_8gpu_a100_bf16",
    "megatron_530b_pretrain_280gpu_a100_bf16",
    "megatron_1t_pretrain_512gpu_a100_bf16",
    "mixtral_8x7b_pretrain_64gpu_h100_bf16",
]


@pytest.mark.parametrize("recipe", sorted(list_recipes()))
def test_every_shipped_recipe_composes_and_plans(recipe: str) -> None:
    res = plan_config(compose(recipe, []))
    assert res.num_candidates > 0
    if recipe in PLANNING_RECIPES:
        assert res.best is not None, (recipe, res.suggestions)
        assert res.best.rates.tokens_per_s_per_gpu > 0 and 0 < res.best.rates.mfu < 1


def test_planning_recipes_are_shipped() -> None:
    assert set(PLANNING_RECIPES) <= set(list_recipes())


def test_cluster_probe_plans_for_this_host_and_names_a_missing_peak() -> None:
    res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "cluster=probe", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["cluster"].startswith("probed_")
    fp8 = runner.invoke(app, ["plan", R70, "cluster=probe"])
    if fp8.exit_code == 2:  # a GPU-less host: the probe knows no FP8 peak
        assert "add peak_tflops.fp8" in fp8.output and "--cluster-file" in fp8.output
    else:
        assert fp8.exit_code == 0, fp8.output


def test_old_gbps_cluster_keys_still_load(tmp_path: Path) -> None:
    """Cluster files written before the *_gbps -> *_gb_s rename (they hold GB/s) still load,
    as --cluster-file and inside a saved run's config.yaml."""
    import yaml

    from llmctl.config.compose import cfg_to_yaml, load_resolved

    cfg = compose("tiny_cpu", [])
    text = cfg_to_yaml(cfg)
    for name in ("hbm", "nvlink", "internode"):
        text = text.replace(f"{name}_bandwidth_gb_s:", f"{name}_bandwidth_gbps:")
    old = tmp_path / "config.yaml"
    old.write_text(text)
    assert load_resolved(old).cluster == cfg.cluster
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(yaml.safe_load(text)["cluster"]))
    res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "--cluster-file", str(cluster), "--json"])
    assert res.exit_code == 0, res.output
