"""Never delete or overwrite what llmctl did not write; one run per output; output-location
errors are one line with exit code 2 (issue 12, findings 1 and 5). Through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmctl.data.outputs import OutputLock
from llmctl.staging import MARKER


@dataclass
class Result:
    """What a user sees from the console script `llmctl data ...`."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def cli(run_main):
    """Run `llmctl data ARGS` through the console entry point (`llmctl.cli.main:main`)."""

    def run(args: list[str]) -> Result:
        return Result(*run_main(["data", *args]))

    return run


def _one_line_error(result: Result, rc: int = 2) -> str:
    assert result.exit_code == rc, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def _user_folder(folder: Path, corpus: Path) -> dict[str, bytes]:
    """The issue's folder: the input itself, precious notes and a README."""
    folder.mkdir()
    shutil.copy(corpus, folder / "corpus.jsonl")
    (folder / "precious_notes.jsonl").write_text('{"text": "mine, not llmctl\'s"}\n')
    (folder / "README.txt").write_text("do not delete\n")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != MARKER}


def test_dedup_into_a_folder_holding_the_input_loses_nothing(
    cli, tmp_path: Path, corpus: Path
) -> None:
    folder = tmp_path / "work"
    before = _user_folder(folder, corpus)
    args = ["dedup", str(folder / "corpus.jsonl"), "-o", str(folder), "-j", "1"]
    line = _one_line_error(cli(args))
    assert "exists; pass --force" in line
    assert _snapshot(folder) == before
    # --force replaces only llmctl's own outputs: corpus.jsonl is the user's input, so the
    # dedup output of the same name is refused and nothing moves.
    line = _one_line_error(cli([*args, "--force"]))
    assert "corpus.jsonl exists and was not written by llmctl" in line
    assert _snapshot(folder) == before
    assert not list(tmp_path.glob("*.llmctl-*")) and not list(tmp_path.glob(".work.*"))


def test_dedup_force_replaces_only_its_own_outputs(cli, tmp_path: Path, corpus: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "README.txt").write_text("mine\n")
    first = tmp_path / "a.jsonl"
    shutil.copy(corpus, first)
    result = cli(["dedup", str(first), "-o", str(folder), "-j", "1", "--force", "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(folder)) == sorted(
        [MARKER, "README.txt", "a.jsonl", "dedup_report.json"]
    )
    marker = json.loads((folder / MARKER).read_text())
    assert marker["files"] == ["a.jsonl", "dedup_report.json"]
    second = tmp_path / "b.jsonl"
    shutil.copy(corpus, second)
    result = cli(["dedup", str(second), "-o", str(folder), "-j", "1", "--force", "--json"])
    assert result.exit_code == 0, result.output
    # a.jsonl was llmctl's (listed in the marker) and is replaced by this run's outputs
    assert sorted(os.listdir(folder)) == sorted(
        [MARKER, "README.txt", "b.jsonl", "dedup_report.json"]
    )
    assert (folder / "README.txt").read_text() == "mine\n"


def test_preprocess_refuses_an_existing_dataset_and_force_touches_only_it(
    cli, tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    prefix = tmp_path / "ds"
    Path(f"{prefix}.bin").write_bytes(b"someone else's data")
    Path(f"{prefix}.notes.txt").write_text("keep me")
    args = ["preprocess", str(corpus), "-o", str(prefix), "-t", str(hf_tokenizer), "-j", "1"]
    line = _one_line_error(cli(args))
    assert f"{prefix}.bin exists; pass --force" in line
    assert Path(f"{prefix}.bin").read_bytes() == b"someone else's data"
    result = cli([*args, "--force", "--json"])
    assert result.exit_code == 0, result.output
    assert Path(f"{prefix}.bin").stat().st_size > 1000
    assert Path(f"{prefix}.notes.txt").read_text() == "keep me"
    line = _one_line_error(cli(args))  # a finished dataset is not silently redone
    assert "exists; pass --force" in line


def test_tokenizer_train_and_corpus_refuse_existing_targets(
    cli, tmp_path: Path, corpus: Path
) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "my_vocab.txt").write_text("mine")
    args = ["tokenizer", "train", str(corpus), "-o", str(tok), "--vocab-size", "300"]
    assert "exists; pass --force" in _one_line_error(cli(args))
    assert cli([*args, "--force"]).exit_code == 0
    assert (tok / "my_vocab.txt").read_text() == "mine" and (tok / "tokenizer.json").is_file()
    assert cli([*args, "--force"]).exit_code == 0  # its own files: replaced again
    out = tmp_path / "c.jsonl"
    out.write_text("user data\n")
    assert "exists; pass --force" in _one_line_error(cli(["corpus", "-o", str(out)]))
    assert out.read_text() == "user data\n"


def test_corpus_force_replaces_only_a_corpus_llmctl_wrote(cli, tmp_path: Path) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"text": "my own document"}\n')
    line = _one_line_error(cli(["corpus", "-o", str(mine), "--force", "--max-docs", "2"]))
    assert line == (
        f"error: {mine} exists and was not written by llmctl; not replacing it (move it away or "
        "choose another --out)"
    )
    assert mine.read_text() == '{"text": "my own document"}\n'
    ours = tmp_path / "c.jsonl"
    assert cli(["corpus", "-o", str(ours), "--max-docs", "3"]).exit_code == 0
    assert cli(["corpus", "-o", str(ours), "--force", "--max-docs", "2"]).exit_code == 0
    records = [json.loads(ln) for ln in ours.read_text().splitlines()]
    assert len(records) == 2 and all(set(r) == {"text", "source"} for r in records)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "mine.jsonl"]


@pytest.mark.parametrize("max_docs", ["0", "-5"])
def test_corpus_max_docs_below_one_is_one_line(cli, tmp_path: Path, max_docs: str) -> None:
    out = tmp_path / "c.jsonl"
    line = _one_line_error(cli(["corpus", "-o", str(out), "--max-docs", max_docs]))
    assert line == f"error: --max-docs must be >= 1, got {max_docs}"
    assert list(tmp_path.iterdir()) == []


def test_demo_never_writes_over_a_folder_it_did_not_make(cli, tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "corpus.jsonl").write_text("my corpus\n")
    (folder / "notes.txt").write_text("mine\n")
    line = _one_line_error(cli(["demo", str(folder)]))
    assert line == (
        f"error: {folder} holds files the demo did not write (corpus.jsonl, notes.txt); "
        "choose a new or empty folder"
    )
    assert (folder / "corpus.jsonl").read_text() == "my corpus\n"
    assert sorted(p.name for p in folder.iterdir()) == ["corpus.jsonl", "notes.txt"]
    line = _one_line_error(cli(["demo", str(folder / "notes.txt")]))
    assert line == f"error: {folder / 'notes.txt'} is a file; the demo writes a folder there"


@pytest.mark.parametrize("command", ["preprocess", "dedup", "tokenizer", "corpus"])
def test_output_under_a_file_is_one_line(
    cli, tmp_path: Path, corpus: Path, hf_tokenizer: Path, command: str
) -> None:
    (tmp_path / "afile").write_text("x")
    target = str(tmp_path / "afile" / "sub" / "out")
    args = {
        "preprocess": ["preprocess", str(corpus), "-o", target, "-t", str(hf_tokenizer)],
        "dedup": ["dedup", str(corpus), "-o", target],
        "tokenizer": ["tokenizer", "train", str(corpus), "-o", target],
        "corpus": ["corpus", "-o", target],
    }[command]
    line = _one_line_error(cli(args))
    assert f"{tmp_path / 'afile'} is a file, not a folder" in line


def test_read_only_output_folder_is_one_line(
    cli, tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    """A real read-only location: a read-only bind mount as root, mode 555 otherwise."""
    ro = tmp_path / "ro"
    ro.mkdir()
    cmd = [sys.executable, "-m", "llmctl", "data", "preprocess", str(corpus), "-o",
           str(ro / "p"), "-t", str(hf_tokenizer)]  # fmt: skip
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare: cannot make a read-only folder")
        script = f'mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && exec "$@"'
        cmd = ["unshare", "-m", "sh", "-c", script, "sh", *cmd]
    else:
        ro.chmod(0o555)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if "mount" in out.stderr and out.returncode != 2:
        pytest.skip(f"cannot bind-mount read-only here: {out.stderr.strip()}")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: cannot write {ro / 'p'}.bin: folder {ro} is not writable"
    ]
    assert list(ro.iterdir()) == []


def test_second_run_on_the_same_output_is_refused(
    cli, tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    prefix = tmp_path / "locked"
    with OutputLock(prefix):  # what a running `llmctl data preprocess -o locked` holds
        args = ["preprocess", str(corpus), "-o", str(prefix), "-t", str(hf_tokenizer)]
        line = _one_line_error(cli(args))
        assert "is being written by another llmctl run (pid" in line
        line = _one_line_error(cli(["dedup", str(corpus), "-o", str(prefix)]))
        assert "is being written by another llmctl run" in line
    assert not Path(f"{prefix}.llmctl-lock").exists()
    assert cli(["preprocess", str(corpus), "-o", str(prefix), "-t", str(hf_tokenizer),
                    "-j", "1"]).exit_code == 0  # fmt: skip


def test_dedup_of_an_empty_file_is_one_line(cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    line = _one_line_error(cli(["dedup", str(empty), "-o", str(tmp_path / "d"), "-j", "1"]))
    assert line == f"error: no documents in {empty} (skipped: none)" or "no documents in" in line
    assert not (tmp_path / "d").exists()


def test_workers_above_core_count_are_capped_with_a_note(cli, tmp_path: Path, corpus: Path,
                                                        hf_tokenizer: Path) -> None:  # fmt: skip
    cores = len(os.sched_getaffinity(0))
    args = ["preprocess", str(corpus), "-o", str(tmp_path / "j"), "-t", str(hf_tokenizer),
            "-j", str(cores + 6), "--json"]  # fmt: skip
    result = cli(args)
    assert result.exit_code == 0, result.output
    assert (
        f"note: -j {cores + 6} is more than the {cores} CPU cores here; using {cores}"
        in result.stderr
    )
    assert json.loads(result.stdout)["num_workers"] == cores


def test_old_output_spellings_still_work_but_are_hidden(cli, tmp_path: Path, corpus: Path,
                                                       hf_tokenizer: Path) -> None:  # fmt: skip
    old = [
        "preprocess",
        str(corpus),
        "--output-prefix",
        str(tmp_path / "p"),
        "-t",
        str(hf_tokenizer),
    ]
    assert cli([*old, "-j", "1"]).exit_code == 0
    assert (
        cli(["dedup", str(corpus), "--output-dir", str(tmp_path / "d"), "-j", "1"]).exit_code == 0
    )
    assert cli(["corpus", str(tmp_path / "c.jsonl"), "--max-docs", "3"]).exit_code == 0
    assert (tmp_path / "p.idx").exists() and (tmp_path / "d" / "dedup_report.json").exists()
    for cmd in (["preprocess"], ["dedup"], ["tokenizer", "train"]):
        text = cli([*cmd, "--help"]).output
        assert "--out" in text and "--output-dir" not in text and "--output-prefix" not in text
    bad = cli(["dedup", str(corpus), "--mode", "nearly"])  # Click's usage error, choices named
    assert bad.exit_code == 2 and "'nearly' is not one of 'exact', 'fuzzy', 'both'" in bad.stderr


def test_output_beside_its_inputs_never_reads_itself(
    cli, tmp_path: Path, corpus: Path, hf_tokenizer: Path
) -> None:
    """`preprocess FOLDER -o FOLDER/ds`: the lock and work folder llmctl creates there while
    it runs are not read as documents."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(corpus, folder / "corpus.jsonl")
    args = ["preprocess", str(folder), "-o", str(folder / "ds"), "-t", str(hf_tokenizer), "-j", "1"]
    result = cli([*args, "--json", "--chunk-mb", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_docs"] == 60
