"""`llmctl export hf`: bad input fails before any heavy work, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app

runner = CliRunner()


def test_run_dir_without_checkpoint(tmp_path: Path) -> None:
    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir

    run = create_run_dir(compose("tiny_cpu", [f"train.run_dir={tmp_path / 'run'}"]), None)
    res = runner.invoke(app, ["export", "hf", str(run), "--out", str(tmp_path / "hf")])
    assert res.exit_code == 2 and "no committed checkpoint" in res.output
    from llmctl.errors import UserError
    from llmctl.hf.export import export_run

    with pytest.raises(UserError, match=r"is not a run directory \(has no config.yaml\)"):
        export_run(tmp_path, tmp_path / "hf")


def test_export_architecture_mapping() -> None:
    from llmctl.config import compose
    from llmctl.errors import UserError
    from llmctl.hf.export import check_exportable

    assert check_exportable(compose("tiny_cpu", []).model) == "LlamaForCausalLM"
    gpt = ["model.normalization=layernorm", "model.activation=gelu",
           "model.position_embedding=learned_absolute"]  # fmt: skip
    cfg = compose("tiny_cpu", [*gpt, "model.num_query_groups=4"])
    assert check_exportable(cfg.model) == "GPT2LMHeadModel"
    with pytest.raises(UserError, match=r"GQA.*multi-head attention only"):
        check_exportable(compose("tiny_cpu", gpt).model)  # tiny has 4 heads, 2 groups
    cfg.model.activation = "swiglu"  # type: ignore[assignment]
    with pytest.raises(UserError, match="no Hugging Face architecture matches"):
        check_exportable(cfg.model)
    cfg.model.activation, cfg.model.num_experts = "gelu", 4  # type: ignore[assignment]
    with pytest.raises(UserError, match="MoE export"):
        check_exportable(cfg.model)
