"""One vocabulary across commands (issue 10, items 5 and 10): `--out/-o` for outputs (old
spellings hidden but working), `recipe=NAME` wherever a recipe is named, closed choices listed
by `--help`, and `recipes list` summaries that are whole sentences."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from llmctl.cli.main import app

runner = CliRunner()


def _help(*cmd: str) -> str:
    res = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_output_options_are_out_and_o() -> None:
    for cmd in (("export", "hf"), ("quantize",), ("topo",)):
        text = _help(*cmd)
        assert "--out -o" in text, (cmd, text)
    assert "--save" not in _help("topo")  # old spelling: hidden


def test_topo_out_and_hidden_save_write_the_same_cluster(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert runner.invoke(app, ["topo", "-o", str(a)]).exit_code == 0
    assert runner.invoke(app, ["topo", "--save", str(b)]).exit_code == 0
    first, second = yaml.safe_load(a.read_text()), yaml.safe_load(b.read_text())
    assert first.keys() == second.keys() and first["name"] == second["name"]


def test_closed_choices_are_listed_in_help() -> None:
    text = _help("quantize")
    assert "default|w8a16_rtn|w4a16_gptq|w4a16_awq|w8a8_smoothquant|fp8_dynamic" in text
    assert "w8a16|w4a16|w8a8|fp8_dynamic" in text and "rtn|gptq|awq" in text
    assert "h100_sxm" in _help("topo")
    bad = runner.invoke(app, ["quantize", "x", "-o", "y", "--scheme", "W5A16"])
    assert bad.exit_code == 2 and "Invalid value for '--scheme'" in bad.output


def test_recipes_show_accepts_recipe_equals_name() -> None:
    plain = runner.invoke(app, ["recipes", "show", "tiny_cpu", "--json"])
    named = runner.invoke(app, ["recipes", "show", "recipe=tiny_cpu", "--json"])
    assert plain.exit_code == named.exit_code == 0, named.output
    assert plain.output == named.output


def test_recipes_list_summaries_are_whole_sentences_without_the_name() -> None:
    import json

    from llmctl.resources import resource_dir

    res = runner.invoke(app, ["recipes", "list", "--json"])
    assert res.exit_code == 0, res.output
    for row in json.loads(res.output):
        name, summary = row["name"], row["summary"]
        assert not summary.startswith(name) and summary.endswith("."), row
        header = (resource_dir("recipes") / f"{name}.yaml").read_text()
        assert " ".join(summary.split()[-3:]) in " ".join(header.replace("#", " ").split())


def test_not_a_run_directory_is_worded_one_way(tmp_path: Path) -> None:
    """Every command that takes a run directory says the same line for the same condition."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for target, why in ((tmp_path / "nope", "does not exist"), (empty, "has no config.yaml")):
        expected = f"{target} is not a run directory ({why}); start one with `llmctl train`"
        for cmd in (["checkpoints"], ["resume"], ["logs"], ["status"], ["export", "hf"]):
            extra = ["-o", str(tmp_path / "o")] if cmd[0] == "export" else []
            res = runner.invoke(app, [*cmd, str(target), *extra], env={"COLUMNS": "300"})
            flat = " ".join(res.output.replace("│", " ").split())
            if cmd == ["status"] and why == "does not exist":  # could be a SLURM job id
                assert "is neither a run directory nor a SLURM job id" in flat
                continue
            assert res.exit_code == 2 and expected in flat, (cmd, target, flat)


def test_quantize_hints_name_only_options_it_has() -> None:
    """Every `--option` that a quantize/export error message suggests exists on the command."""
    import re

    import llmctl

    root = Path(llmctl.__file__).parent
    named = set()
    for name in ("quant/quantize.py", "quant/calibration.py", "quant/schemes.py", "hf/export.py"):
        named |= set(re.findall(r"(--[a-z][a-z-]+)", (root / name).read_text()))
    options = set(re.findall(r"(--[a-z][a-z-]+)", _help("quantize") + _help("export", "hf")))
    assert "--tokenizer" in named and not named - options, named - options
