"""`llmctl data ...` through Typer's CliRunner: JSON summaries and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmctl.cli.main import app

runner = CliRunner()


def test_preprocess_json_summary(tmp_path: Path, corpus: Path, hf_tokenizer: Path) -> None:
    prefix = tmp_path / "ds"
    args = ["data", "preprocess", str(corpus), "-o", str(prefix), "-t", str(hf_tokenizer)]
    result = runner.invoke(app, [*args, "-j", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_docs"] == 60 and summary["tokens_per_s"] > 0
    assert (tmp_path / "ds.idx").exists() and (tmp_path / "ds.manifest.json").exists()


def test_dedup_dry_run_json(tmp_path: Path, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", ["same text here", "same text here", "other"])
    result = runner.invoke(app, ["data", "dedup", str(path), "--dry-run", "-j", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_kept"] == 2 and report["num_exact_removed"] == 1


def test_bad_input_exits_2_with_one_line(tmp_path: Path, hf_tokenizer: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no field"}\n')
    args = ["data", "preprocess", str(bad), "-o", str(tmp_path / "x"), "-t", str(hf_tokenizer)]
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert "bad.jsonl:2: missing text field" in result.output
    assert "Traceback" not in result.output


def test_tokenizer_train_and_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    result = runner.invoke(app, ["data", "corpus", str(corpus), "--max-docs", "20", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["num_docs"] == 20
    args = ["data", "tokenizer", "train", str(corpus), "-o", str(tmp_path / "t")]
    result = runner.invoke(app, [*args, "--vocab-size", "400", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vocab_size"] == 400


def test_bad_choice_is_a_user_error(tmp_path: Path, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", ["x"])
    result = runner.invoke(app, ["data", "dedup", str(path), "--dry-run", "--verify", "maybe"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    args = ["data", "preprocess", str(path), "-o", "x", "-t", "t.json", "--on-error", "never"]
    assert runner.invoke(app, args).exit_code == 2


def test_slurm_print_script_renders_without_submitting(tmp_path: Path, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", ["a b c", "d e f"])
    out = tmp_path / "out"
    args = ["data", "dedup", str(path), "-o", str(out), "--launcher", "slurm", "--print-script"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["num_tasks"] == 1 and "array_job" not in job
    assert "#SBATCH --array=0-0" in job["text"] and not out.exists()
    assert f"{job['job_dir']}/job.json" in job["text"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # nothing written


def test_slurm_preprocess_print_script_writes_nothing(
    tmp_path: Path, write_jsonl, hf_tokenizer: Path
) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", ["a b c", "d e f"])
    args = ["data", "preprocess", str(path), "-o", str(tmp_path / "ds"), "-t", str(hf_tokenizer)]
    result = runner.invoke(app, [*args, "--launcher", "slurm", "--print-script"])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --array=0-0" in result.stdout and "preprocess-merge" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_slurm_user_errors_are_one_line_and_leave_nothing(
    tmp_path: Path, hf_tokenizer: Path, run_main
) -> None:
    """A missing text field or an empty input fails at submission (rc 2, one line), before
    any job folder, script or lock is written; no sbatch is reached."""
    (tmp_path / "body.jsonl").write_text('{"body": "a b c"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    inputs = sorted(p.name for p in tmp_path.iterdir())
    tok = ["-t", str(hf_tokenizer)]
    cases = [
        ("dedup", "body.jsonl", [], "body.jsonl:1: missing text field ('text')"),
        ("dedup", "empty.jsonl", [], "no documents in"),
        ("preprocess", "body.jsonl", tok, "body.jsonl:1: missing text field ('text')"),
        ("preprocess", "empty.jsonl", tok, "no documents in"),
    ]
    for command, name, extra, line in cases:
        for print_script in ([], ["--print-script"]):
            argv = ["data", command, str(tmp_path / name), "-o", str(tmp_path / "out"), *extra]
            code, stdout, stderr = run_main([*argv, "--launcher", "slurm", *print_script])
            assert (code, stdout) == (2, ""), stderr
            assert stderr.count("\n") == 1 and line in stderr, stderr
            assert sorted(p.name for p in tmp_path.iterdir()) == inputs


def test_sizes_below_their_minimum_are_one_line_before_any_work(
    tmp_path: Path, corpus: Path, hf_tokenizer: Path, run_main
) -> None:
    import pytest

    from llmctl.data.preprocess import PreprocessConfig
    from llmctl.errors import UserError

    # the library first: a zero chunk size used to grow memory without bound, so the CLI call
    # below runs only once the config refuses it
    with pytest.raises(UserError, match="--chunk-mb must be >= 1, got 0"):
        PreprocessConfig(inputs=[str(corpus)], output_prefix="x", tokenizer="t", chunk_bytes=0)
    prefix = str(tmp_path / "ds")
    pre = ["data", "preprocess", str(corpus), "-o", prefix, "-t", str(hf_tokenizer), "-j", "1"]
    tok = ["data", "tokenizer", "train", str(corpus), "-o", str(tmp_path / "tok")]
    cases = [
        ([*pre, "--chunk-mb", "0"], "error: --chunk-mb must be >= 1, got 0"),
        ([*pre, "--max-doc-mb", "0"], "error: --max-doc-mb must be >= 1, got 0"),
        ([*tok, "--vocab-size", "10"], "error: --vocab-size must be >= 257 (256 byte tokens"),
        ([*tok, "--min-frequency", "-3"], "error: --min-frequency must be >= 0, got -3"),
        ([*pre[:-2], "-j", "-1"], "error: -j/--workers must be >= 0 (0: one per core), got -1"),
        (
            ["data", "dedup", str(corpus), "-o", str(tmp_path / "dd"), "-j", "-2"],
            "error: -j/--workers must be >= 0 (0: one per core), got -2",
        ),
    ]
    for argv, line in cases:
        code, stdout, stderr = run_main(argv)
        assert (code, stdout) == (2, ""), stderr
        assert stderr.startswith(line) and stderr.count("\n") == 1, stderr
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith("-lock")) == []


def test_local_user_errors_leave_no_work_folder(tmp_path: Path, run_main) -> None:
    """Locally too: a document without the text field (after good ones) or an empty input is
    one line, rc 2, and leaves nothing next to the output: no `OUT.llmctl-tmp` work folder."""
    good = "".join(json.dumps({"text": f"doc {i} " * 20}) + "\n" for i in range(50))
    (tmp_path / "body.jsonl").write_text(good + '{"body": "a b c"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    inputs = sorted(p.name for p in tmp_path.iterdir())
    for name, line in [
        ("body.jsonl", "body.jsonl:51: missing text field"),
        ("empty.jsonl", "no documents in"),
    ]:
        argv = ["data", "dedup", str(tmp_path / name), "-o", str(tmp_path / "out"), "--json"]
        code, stdout, stderr = run_main(argv)
        assert (code, stdout) == (2, ""), stderr
        assert stderr.count("\n") == 1 and line in stderr, stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == inputs
