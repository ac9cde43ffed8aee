"""`llmctl eval`'s checks before any model loads: bad input is one line, exit code 2; the shipped
task's YAML is what the harness reads; the run's validation split is megatron's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.eval.heldout import validation_range, validation_tokens
from llmctl.eval.tasks import SHIPPED, TASK_FILES, check_tasks, user_task_names, write_shipped_tasks


def _model_dir(path: Path, vocab: int = 50) -> Path:
    """A model directory as far as the checks read it: config.json and a safetensors header."""
    path.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab,
              "max_position_embeddings": 32}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    return path


@pytest.fixture
def fails(run_main: Any) -> Any:
    """`llmctl eval ARGS` through the console entry point: exit 2, one line on stderr."""

    def check(args: list[str], *words: str) -> str:
        code, out, err = run_main(["eval", *args])
        assert code == 2 and not out, (code, out, err)
        line = err.strip()
        assert line.startswith("error: ") and "\n" not in line, err
        for word in words:
            assert word in line, line
        return line

    return check


def test_missing_source(tmp_path: Path, fails: Any) -> None:
    fails([str(tmp_path / "nope")], "nope", "not found")


def test_source_is_a_file(tmp_path: Path, fails: Any) -> None:
    (tmp_path / "f").write_text("x")
    fails([str(tmp_path / "f")], "is not a directory")


def test_folder_that_is_not_a_model(tmp_path: Path, fails: Any) -> None:
    (tmp_path / "empty").mkdir()
    fails([str(tmp_path / "empty")], "is not a model", "config.json")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    fails([str(tmp_path / "noweights")], "safetensors")


def test_not_a_causal_lm(tmp_path: Path, fails: Any) -> None:
    model = _model_dir(tmp_path / "m")
    (model / "config.json").write_text('{"architectures": ["BertModel"]}')
    fails([str(model)], "BertModel", "causal LM")


def test_unknown_task_before_any_source_check(tmp_path: Path, fails: Any) -> None:
    fails(
        [str(tmp_path / "nope"), "--task", "hellaswag"], "unknown task 'hellaswag'", "llmctl_arith"
    )


def test_bad_vs_and_bad_data(tmp_path: Path, fails: Any) -> None:
    model = _model_dir(tmp_path / "m")
    fails([str(model), "--vs", str(tmp_path / "other")], "other", "not found")
    fails([str(model), "--data", str(tmp_path / "held.jsonl")], "held.jsonl", "not found")


def test_step_is_for_run_directories(tmp_path: Path, fails: Any) -> None:
    fails([str(_model_dir(tmp_path / "m")), "--step", "3"], "--step")


def test_dry_run_without_data_says_perplexity_is_not_scored(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["eval", str(_model_dir(tmp_path / "m")), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["tasks"] == ["llmctl_arith"] and plan["heldout"] is None
    assert plan["models"][0]["seq_len"] == 32  # capped at max_position_embeddings
    assert any("perplexity not scored" in n for n in plan["notes"])


def test_user_tasks_dir(tmp_path: Path, fails: Any) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "mine.yaml").write_text("task: mine\nprocess_docs: !function utils.f\n")
    assert set(user_task_names(tmp_path / "t")) == {"mine"}
    assert check_tasks(("mine", "llmctl_arith"), tmp_path / "t") == ("mine", "llmctl_arith")
    with pytest.raises(Exception, match="unknown task 'other'"):
        check_tasks(("other",), tmp_path / "t")
    (tmp_path / "none").mkdir()
    fails([str(tmp_path), "--tasks-dir", str(tmp_path / "none")], "holds no YAML")


def test_shipped_task_yaml_names_its_jsonl_absolutely(tmp_path: Path) -> None:
    dest = write_shipped_tasks(tmp_path / "tasks")
    for task in SHIPPED.values():
        cfg = yaml.safe_load((dest / f"{task.name}.yaml").read_text())
        data = Path(cfg["dataset_kwargs"]["data_files"]["test"])
        assert data.is_absolute() and data == (TASK_FILES / task.jsonl).resolve()
        assert cfg["dataset_path"] == "json" and cfg["output_type"] == "multiple_choice"
        assert cfg["doc_to_text"] == "Question: {{question}}\nAnswer:"
    rows = [json.loads(x) for x in (TASK_FILES / "llmctl_arith.jsonl").read_text().splitlines()]
    assert len(rows) == 100
    for r in rows:
        a, b = (int(x) for x in r["question"].removesuffix(" =").split(" + "))
        assert int(r["choices"][r["answer"]]) == a + b and len(set(r["choices"])) == 4


def test_write_tasks_keeps_a_users_file_of_the_same_name(fails: Any, tmp_path: Path) -> None:
    """`--write-tasks DIR` rewrites only task files llmctl wrote; a user's stays untouched."""
    dest = tmp_path / "tasks"
    write_shipped_tasks(dest)
    write_shipped_tasks(dest)  # its own earlier output: rewritten
    (dest / "llmctl_arith.yaml").write_text("task: mine\n")
    fails([str(tmp_path), "--write-tasks", str(dest), "--dry-run"], "llmctl did not write it")
    assert (dest / "llmctl_arith.yaml").read_text() == "task: mine\n"


@pytest.mark.parametrize("split", ["98,2,0", "90,7,3", "1,1,1", "80/15/5"])
def test_validation_split_is_megatrons(tmp_path: Path, split: str) -> None:
    """The validation sequences of megatron-core's split matrix, cut as its builder cuts them."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    from llmctl.data.indexed import ShardWriter

    docs = [np.arange(i * 10, i * 10 + 3 + i % 4, dtype=np.uint16) for i in range(37)]
    prefix = tmp_path / "d"
    w = ShardWriter(prefix, np.uint16)
    w.add_documents(np.concatenate(docs), np.asarray([len(d) for d in docs]))
    w.close()
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    begin, end = (round(x * 37.0) for x in matrix[1])  # as the builder rounds (int(round()))
    assert validation_range(37, split) == (begin, end)
    got = validation_tokens(str(prefix), split)
    assert np.array_equal(got, np.concatenate(docs[begin:end]))
