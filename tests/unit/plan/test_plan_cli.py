"""`llmctl plan` through Typer's CliRunner, and every shipped recipe planned on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.config import compose, list_recipes
from llmctl.run.planning import plan_config

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
    from llmctl.errors import UserError
    from llmctl.run.planning import CALIBRATED_HEADER, save_calibrated

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


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--dp", "5"], "64 GPUs not divisible by TP*PP*CP*DP = 1*1*1*5"),
        (["--tp", "8", "--dp", "16"], "64 GPUs not divisible by TP*PP*CP*DP = 8*1*1*16"),
        (["plan.headroom_fraction=1.5"], "plan.headroom_fraction must be in [0, 1), got 1.5"),
        (["plan.micro_batch_sizes=[]"], "plan.micro_batch_sizes must be a non-empty list"),
        (["plan.top_k=0"], "plan.top_k must be >= 1, got 0"),
        (["cluster.nvlink_domain_size=0"], "cluster.nvlink_domain_size must be >= 1"),
    ],
)
def test_impossible_fixed_dp_and_bad_plan_settings_are_one_line(args: list[str], line: str) -> None:
    """A fixed DP that cannot divide the world, and out-of-range plan.* / cluster settings,
    are one line naming the field (they were an empty 'closest' table with exit code 0, or a
    ValueError traceback)."""
    res = runner.invoke(app, ["plan", R70, *args])
    assert res.exit_code == 2, res.output
    assert line in res.output
    assert "Traceback" not in res.output and "Closest layout" not in res.output


def test_cpu_ranks_follow_the_layout_as_in_train() -> None:
    """On a CPU cluster `llmctl train` makes as many ranks as the layout asks; `plan` plans the
    same world (it refused `--pp 2` on the one-rank tiny_cpu cluster, which train runs), and
    a layout both refuse is refused with the same line."""
    res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "--pp", "2", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["world_size"] == 2 and data["ranked"][0]["layout"]["pp"] == 2
    plan_res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "--dp", "3"])
    train_res = runner.invoke(app, ["train", "recipe=tiny_cpu", "--dp", "3", "--dry-run"])
    assert plan_res.exit_code == train_res.exit_code == 2, plan_res.output + train_res.output
    assert "GBS 8 not divisible by MBS*DP = 4*3" in plan_res.output
    assert plan_res.output.strip() in train_res.output


def test_no_valid_layout_suggests_a_batch_or_node_count_that_works() -> None:
    """On 3 nodes (24 GPUs) every DP has a factor 3 and misses GBS 128, and so do 2x-16x the
    nodes: the plan said a larger-memory GPU or a smaller model was needed (false: the
    recipe fits its 8 nodes) under an empty 'closest' table. It names batch sizes and node
    counts that do plan, and each one does."""
    res = runner.invoke(app, ["plan", R70, "--nodes", "3", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["num_candidates"] == 0 and data["closest"] is None
    tips = data["suggestions"]
    assert not any("larger-memory GPU" in tip for tip in tips), tips
    assert any(tip.startswith("global batch size 120 (--gbs 120)") for tip in tips), tips
    assert any(tip.startswith("4 nodes (32 GPUs, --nodes 4)") for tip in tips), tips
    for extra in (["--nodes", "3", "--gbs", "120"], ["--nodes", "4"]):
        again = json.loads(runner.invoke(app, ["plan", R70, *extra, "--json"]).output)
        assert again["ranked"], extra
    text = runner.invoke(app, ["plan", R70, "--nodes", "3"]).output
    assert "No valid layout. What would:" in text and "Closest layout" not in text


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--ep", "3"], "EP=3 does not divide 8 experts"),
        (["parallel.etp=3"], "64 GPUs not divisible by ETP*EP*PP = 3*1*1"),
        (
            ["parallel.moe_a2a_overlap=true", "--ep", "1"],
            "parallel.moe_a2a_overlap=true needs EP > 1, EP=1 is fixed",
        ),
        (
            ["parallel.moe_a2a_overlap=true", "parallel.recompute=full"],
            "needs recompute other than full, parallel.recompute=full is fixed",
        ),
        (
            ["parallel.moe_a2a_overlap=true", "--pp", "4", "--vpp", "1"],
            "needs VPP > 1 when PP > 1, PP=4 VPP=1 is fixed",
        ),
    ],
)
def test_impossible_fixed_moe_dims_are_one_line_in_plan_and_train(
    args: list[str], line: str
) -> None:
    """Fixed expert dimensions that cannot work: `plan` printed an empty search (exit 0) and
    `train --dry-run` 'the planner found no valid layout' followed by unrelated tips; both
    now name the field and why, with exit code 2."""
    mixtral = "recipe=mixtral_8x7b_pretrain_64gpu_h100_bf16"
    wide = {"COLUMNS": "300"}  # the error panel is as wide as the terminal
    res = runner.invoke(app, ["plan", mixtral, *args], env=wide)
    dry = runner.invoke(app, ["train", mixtral, *args, "launcher=slurm", "--dry-run"], env=wide)
    for out in (res, dry):
        assert out.exit_code == 2, out.output
        assert line in out.output and "Traceback" not in out.output


def test_missing_peak_suggests_a_precision_the_cluster_states() -> None:
    """local_cpu states only fp32: planning bf16 there suggested `precision=bf16` itself."""
    res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "precision=bf16"], env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert "states no peak TFLOP/s for bf16" in res.output
    assert "(e.g. precision=fp32)" in res.output and "precision=bf16)" not in res.output


def test_plot_into_a_new_folder_and_with_nothing_to_plot(tmp_path: Path) -> None:
    """`--plot` into a folder that does not exist yet (accepted by the up-front check) was a
    FileNotFoundError traceback after the plan; a plan without any valid layout was a
    ValueError traceback. The first writes the figure (whole, nothing else left there), the
    second is one line, exit code 2, and writes nothing."""
    png = tmp_path / "new" / "sub" / "plan.png"
    res = runner.invoke(app, ["plan", R70, "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in png.parent.iterdir()] == ["plan.png"]
    empty = tmp_path / "none.png"
    args = ["plan", R70, "--nodes", "3", "--plot", str(empty)]
    res = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert "no valid layout to plot" in res.output and not empty.exists()
    assert "Traceback" not in res.output


@pytest.mark.parametrize("extra", [["--nodes", "16"], ["--tp", "8", "--pp", "4"]])
def test_published_layout_is_compared_only_within_its_search(extra: list[str]) -> None:
    """The recipe's published layout (64 GPUs, TP4 PP8) was ranked against a 128-GPU search
    (#1672) and against a TP8 PP4 search, where --explain called it 'the fastest fitting
    layout', though that search cannot list it. Now it is left out there."""
    data = json.loads(runner.invoke(app, ["plan", R70, *extra, "--json"]).output)
    assert data["ranked"] and data["published"] is None and data["published_rank"] is None
    text = runner.invoke(app, ["plan", R70, *extra, "--explain"]).output
    assert "Published layout" not in text
    full = json.loads(runner.invoke(app, ["plan", R70, "--json"]).output)
    assert full["published_rank"] == 8


def test_cpu_tensor_parallel_is_planned_without_sequence_parallelism_as_train_runs_it() -> None:
    """`llmctl train` runs TP on CPU without sequence parallelism (and refuses it asked for);
    the plan predicted TP2 with SP, a layout that never runs there."""
    res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "--tp", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert {r["layout"]["sequence_parallel"] for r in json.loads(res.output)["ranked"]} == {False}
    wide = {"COLUMNS": "300"}
    asked = ["recipe=tiny_cpu", "--tp", "2", "parallel.sequence_parallel=true"]
    plan_res = runner.invoke(app, ["plan", *asked], env=wide)
    train_res = runner.invoke(app, ["train", *asked, "--dry-run"], env=wide)
    line = "parallel.sequence_parallel=true needs GPUs"
    assert plan_res.exit_code == train_res.exit_code == 2, plan_res.output + train_res.output
    assert line in plan_res.output and line in train_res.output


def test_nothing_fits_on_one_node_tries_no_zero_node_cluster() -> None:
    """One node where nothing fits: the nearby node counts tried must start at 1 (0 nodes
    was a ValueError from ClusterSpec, seen by `train` as a bare 'num_nodes ... >= 1')."""
    res = runner.invoke(app, ["plan", "recipe=tiny_cpu", "cluster.hbm_gib=0.01"])
    assert res.exit_code == 0, res.output
    assert "Nothing fits. What would:" in res.output and "nothing tried fits" in res.output
