"""`llmctl data clean` end to end: outputs, report, chaining into dedup and preprocess, dry
run, bad input, rejected file, workers and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.data.clean import Pipeline, clean, clean_chunk, work_dir_for
from llmctl.data.clean_config import CleanConfig, Step
from llmctl.data.clean_corpus import build_corpus
from llmctl.data.readers import discover, plan_chunks
from llmctl.errors import UserError

runner = CliRunner()


@pytest.fixture(scope="module")
def raw_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clean") / "in.jsonl"
    docs = build_corpus(max_docs=300, seed=2)
    docs_text = [d.text for d in docs]
    docs_text[5] += "\nWrite to jane.roe@example.com or call +1 415 555 2671 from 10.1.2.3."
    with open(path, "w") as f:
        for i, text in enumerate(docs_text):
            f.write(json.dumps({"text": text, "id": i, "meta": {"k": [1, 2]}}) + "\n")
    return path


def _records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "in.jsonl").read_text().splitlines()]


def test_clean_writes_kept_records_report_and_rejected(tmp_path: Path, raw_corpus: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["data", "clean", str(raw_corpus), "-o", str(out), "--pii",
                                 "--rejected", "--json", "-j", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    kept, rejected = _records(out), (out / "rejected.jsonl").read_text().splitlines()
    assert report["num_docs"] == 300 and len(kept) + len(rejected) == 300
    assert report["num_kept"] == len(kept) and 0 < len(kept) < 300
    assert sum(s["num_removed"] for s in report["steps"].values()) == len(rejected)
    # the same decisions as the pipeline run directly, in input order
    cfg = CleanConfig(inputs=[str(raw_corpus)], steps=[*report["params"]["steps"]])
    lines = raw_corpus.read_text().splitlines()
    verdicts = [Pipeline(cfg).run(json.loads(x)["text"]) for x in lines]
    assert [r["id"] for r in kept] == [i for i, v in enumerate(verdicts) if v.step is None]
    for r in kept:  # other fields kept; unchanged records copied byte for byte
        assert r["meta"] == {"k": [1, 2]} and r["text"] == verdicts[r["id"]].text
    first = json.loads(rejected[0])
    assert first["step"] in report["steps"] and first["reason"] and first["line"] >= 1
    for s in report["steps"].values():
        assert s["share_removed"] == pytest.approx(s["num_removed"] / 300, abs=1e-6)
        assert len(s["examples"]) == min(3, s["num_removed"])
    assert (out / ".llmctl-outputs.json").exists() and not work_dir_for(cfg_out(out)).exists()


def cfg_out(out: Path) -> CleanConfig:
    return CleanConfig(inputs=["x"], output_dir=str(out))


def test_pii_is_replaced_in_kept_records(tmp_path: Path, raw_corpus: Path) -> None:
    out = tmp_path / "out"
    report = clean(CleanConfig(inputs=[str(raw_corpus)], output_dir=str(out), steps=[Step.PII]))
    assert report["num_kept"] == 300
    pii = report["pii_replaced"]
    assert pii["email"] >= 1 and pii["ip"] >= 1 and pii["phone"] >= 1
    doc5 = _records(out)[5]["text"]
    assert "jane.roe@example.com" not in doc5 and "<EMAIL>" in doc5 and "<PHONE>" in doc5
    assert "<IP_ADDRESS>" in doc5


def test_chains_into_dedup_and_preprocess(tmp_path: Path, raw_corpus: Path, hf_tokenizer) -> None:
    out = tmp_path / "clean"
    clean(CleanConfig(inputs=[str(raw_corpus)], output_dir=str(out), write_rejected=True))
    dd = tmp_path / "dedup"
    result = runner.invoke(app, ["data", "dedup", str(out), "-o", str(dd), "--json"])
    assert result.exit_code == 0, result.output
    clean_report = json.loads((out / "clean_report.json").read_text())
    dedup_report = json.loads((dd / "dedup_report.json").read_text())
    assert dedup_report["num_docs"] == clean_report["num_kept"]  # no report or rejected read
    produced = {o["sha256"] for o in clean_report["outputs"]}
    assert {i["sha256"] for i in dedup_report["inputs"]} == produced
    prefix = tmp_path / "tok" / "data"
    result = runner.invoke(app, ["data", "preprocess", str(dd), "-t", str(hf_tokenizer),
                                 "-o", str(prefix), "--json", "-j", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_docs"] == dedup_report["num_kept"]


def test_dry_run_writes_nothing(tmp_path: Path, raw_corpus: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["data", "clean", str(raw_corpus), "-o", str(out), "--dry-run",
                                 "--sample", "100", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_docs"] == 100 and report["dry_run"] is True
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_input_is_one_line_naming_file_and_line(
    tmp_path: Path, raw_corpus: Path, run_main
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(raw_corpus.read_text().splitlines()[0] + "\n{not json\n")
    out = tmp_path / "out"
    code, stdout, stderr = run_main(["data", "clean", str(bad), "-o", str(out), "--json"])
    assert (code, stdout) == (2, ""), stderr
    assert stderr.count("\n") == 1 and f"{bad}:2: invalid JSON" in stderr, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    args = ["--on-error", "skip", "--filters", "none", "--pii", "--json"]
    result = runner.invoke(app, ["data", "clean", str(bad), "-o", str(out), *args])
    assert result.exit_code == 0 and json.loads(result.stdout)["num_docs"] == 1


def test_user_errors(tmp_path: Path, raw_corpus: Path) -> None:
    for args, msg in [
        (["--set", "c4.nosuch=1"], "unknown option"),
        (["--filters", "gopher"], "unknown filter"),
        (["--languages", "xx"], "unknown language"),
        (["--decontam", str(tmp_path / "none.jsonl")], "does not exist"),
    ]:
        result = runner.invoke(app, ["data", "clean", str(raw_corpus), "-o", str(tmp_path / "o"),
                                     *args])  # fmt: skip
        text = " ".join(result.output.replace("│", " ").split())  # Rich wraps long tmp paths
        assert result.exit_code == 2 and msg in text, (args, result.output)
    assert list(tmp_path.iterdir()) == []  # no output and no work folder left behind


def test_a_work_folder_llmctl_did_not_write_is_kept(tmp_path: Path, raw_corpus: Path) -> None:
    out = tmp_path / "o"
    theirs = tmp_path / "o.llmctl-tmp"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["data", "clean", str(raw_corpus), "-o", str(out)])
    assert result.exit_code == 2 and "was not written by llmctl" in result.output, result.output
    assert (theirs / "notes.txt").read_text() == "mine" and not out.exists()


def test_workers_and_resume_give_the_same_output(tmp_path: Path, raw_corpus: Path) -> None:
    def cfg(out: Path, j: int) -> CleanConfig:
        return CleanConfig(inputs=[str(raw_corpus)], output_dir=str(out), num_workers=j,
                           chunk_bytes=64 << 10, write_rejected=True)  # fmt: skip

    one, two = tmp_path / "one", tmp_path / "two"
    clean(cfg(one, 1))
    clean(cfg(two, 2))
    chunks, _ = plan_chunks(discover([str(raw_corpus)]), 64 << 10)
    assert len(chunks) > 2
    for name in ("in.jsonl", "rejected.jsonl"):
        assert (one / name).read_bytes() == (two / name).read_bytes()
    # a run killed after its first chunk: that chunk's finished parts are reused
    three = tmp_path / "three"
    c3 = cfg(three, 1)
    from llmctl.data.clean import prepare_work_dir

    work = prepare_work_dir(c3, chunks, plan_chunks(discover([str(raw_corpus)]), 64 << 10)[1])
    clean_chunk(chunks[0], c3, work)
    part = work / "part_000000_0000.jsonl"
    marker = b'{"text": "resumed part"}\n'
    part.write_bytes(marker + part.read_bytes())
    clean(c3)
    assert (three / "in.jsonl").read_bytes() == marker + (one / "in.jsonl").read_bytes()


def test_decontam_drop_and_flag(tmp_path: Path, raw_corpus: Path) -> None:
    lines = raw_corpus.read_text().splitlines()
    victim = json.loads(lines[7])["text"]
    evals = tmp_path / "eval.txt"
    evals.write_text(" ".join(victim.split()[:40]) + "\n")
    from llmctl.data.filters.decontam import DecontamConfig

    drop = clean(CleanConfig(inputs=[str(raw_corpus)], output_dir=str(tmp_path / "a"),
                             steps=[Step.DECONTAM],
                             decontam=DecontamConfig(eval_files=[str(evals)])))  # fmt: skip
    assert drop["steps"]["decontam"]["num_removed"] >= 1
    assert 7 not in [r["id"] for r in _records(tmp_path / "a")]
    flagging = DecontamConfig(eval_files=[str(evals)], action="flag")
    flag = clean(CleanConfig(inputs=[str(raw_corpus)], output_dir=str(tmp_path / "b"),
                             steps=[Step.DECONTAM], decontam=flagging))  # fmt: skip
    assert flag["num_kept"] == 300 and flag["num_contamination_flagged"] >= 1
    assert _records(tmp_path / "b")[7]["contamination"] is True
    with pytest.raises(UserError, match="evaluation files"):
        clean(CleanConfig(inputs=[str(raw_corpus)], output_dir=str(tmp_path / "c"),
                          steps=[Step.DECONTAM]))  # fmt: skip
