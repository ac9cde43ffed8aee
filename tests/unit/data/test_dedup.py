"""dedup: exact copies go, planted near-duplicates are found per similarity band."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmctl.data.dedup import DedupConfig, DedupMode, Verify, dedup
from llmctl.data.synthetic import planted_corpus
from llmctl.data.unionfind import components
from llmctl.errors import UserError

BANDS = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01)]


def test_components_label_is_smallest_member() -> None:
    labels = components(7, np.array([5, 1, 3]), np.array([3, 2, 6]))
    assert labels.tolist() == [0, 1, 1, 3, 4, 3, 3]


def test_exact_mode_keeps_first_of_normalised_copies(tmp_path: Path, write_jsonl) -> None:
    texts = ["Hello world, again.", "unique one", "hello   WORLD again", "unique two"]
    path = write_jsonl(tmp_path / "in.jsonl", texts)
    out = tmp_path / "out"
    report = dedup(
        DedupConfig(inputs=[str(path)], output_dir=str(out), mode=DedupMode.EXACT, num_workers=1)
    )
    kept = [json.loads(line)["text"] for line in (out / "in.jsonl").read_text().splitlines()]
    assert kept == [texts[0], texts[1], texts[3]]
    assert report.num_exact_removed == 1 and report.examples[0]["removed"] == [f"{path}:3"]
    assert json.loads((out / "dedup_report.json").read_text())["num_kept"] == 3


@pytest.mark.parametrize("verify", [Verify.EXACT, Verify.SIGNATURE])
def test_planted_near_duplicates_recall_and_precision_per_band(
    tmp_path: Path, write_jsonl, verify: Verify
) -> None:
    planted = planted_corpus(num_bases=500, num_plain=200, seed=7)
    path = write_jsonl(tmp_path / "planted.jsonl", planted.texts)
    cfg = DedupConfig(inputs=[str(path)], output_dir=str(tmp_path / "o"), verify=verify)
    cfg.num_workers = 2
    report = dedup(cfg)
    kept = {
        json.loads(line)["i"]
        for line in (tmp_path / "o" / "planted.jsonl").read_text().splitlines()
    }
    found = np.array([b not in kept for _, b in planted.pairs])
    sims = np.array(planted.jaccard)
    per_band = {
        lo: (found[(sims >= lo) & (sims < hi)].mean(), int(((sims >= lo) & (sims < hi)).sum()))
        for lo, hi in BANDS
    }
    above = sims >= cfg.threshold
    assert above.sum() > 100 and (~above).sum() > 100  # both sides are exercised
    recall = found[above].mean()
    false_merges = found[sims < 0.7].mean()
    print(verify, {lo: (round(r, 3), n) for lo, (r, n) in per_band.items()}, report.precision)
    if verify is Verify.EXACT:
        # LSH finds a pair at J=0.8 with p=0.998; exact verification decides the rest
        assert recall >= 0.98 and false_merges == 0.0, per_band
    else:
        # the signature estimate has a standard error of ~0.037 at J=0.8 with 120 values:
        # pairs just above the threshold are missed, pairs well above are not
        assert found[sims >= 0.9].mean() >= 0.98 and recall >= 0.85, per_band
        assert false_merges <= 0.02, per_band
    assert all(b in kept for b, _ in planted.pairs)  # the first copy is the one kept
    # signature mode merges some pairs just below 0.8 (estimate noise), hence lower precision
    assert report.precision["precision"] >= (1.0 if verify is Verify.EXACT else 0.85)


def test_dry_run_writes_nothing_and_bad_options_are_user_errors(
    tmp_path: Path, write_jsonl
) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", ["a b c d e f", "a b c d e f", "x y z"])
    report = dedup(DedupConfig(inputs=[str(path)], dry_run=True, num_workers=1))
    assert report.num_kept == 2 and report.output_dir is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    with pytest.raises(UserError, match="threshold"):
        dedup(DedupConfig(inputs=[str(path)], dry_run=True, threshold=1.5))
    with pytest.raises(UserError, match="output folder"):
        dedup(DedupConfig(inputs=[str(path)]))


def test_output_lines_are_the_input_lines_of_kept_documents_in_every_layout(
    tmp_path: Path,
) -> None:
    """Step 3 copies kept JSONL lines by line number without parsing them again: with bad and
    blank lines skipped, many chunks or one, plain or gzip, the output is exactly the input
    lines of the kept documents, and the kept documents are the planted truth's."""
    import gzip

    planted = planted_corpus(num_bases=40, num_plain=40, seed=3)
    lines = []
    for i, t in enumerate(planted.texts):
        lines.append(json.dumps({"text": t, "i": i}) + "\n")
        if i % 7 == 3:
            lines += ["not json\n", "\n", json.dumps({"other": 1}) + "\n"]
    data = "".join(lines).encode()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "c.jsonl").write_bytes(data)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "c.jsonl.gz").write_bytes(gzip.compress(data))
    by_line = {json.loads(x)["i"]: x for x in lines if x.startswith('{"text"')}
    kept_ids = []
    layouts = [("plain", "c.jsonl", 16 << 10), ("plain", "c.jsonl", 32 << 20),
               ("gz", "c.jsonl.gz", 32 << 20)]  # fmt: skip
    for folder, name, chunk_bytes in layouts:
        out = tmp_path / f"out-{folder}-{chunk_bytes}"
        cfg = DedupConfig(inputs=[str(tmp_path / folder)], output_dir=str(out), num_workers=1,
                          on_error="skip", chunk_bytes=chunk_bytes)  # fmt: skip
        report = dedup(cfg)
        raw = (
            gzip.decompress((out / name).read_bytes())
            if folder == "gz"
            else (out / name).read_bytes()
        )
        got = raw.decode().splitlines(keepends=True)
        ids = [json.loads(x)["i"] for x in got]
        assert got == [by_line[i] for i in ids] and ids == sorted(ids)
        assert len(ids) == report.num_kept and report.problems["counts"]
        kept_ids.append(ids)
    assert kept_ids[0] == kept_ids[1] == kept_ids[2]
    kept = set(kept_ids[0])
    sims = np.array(planted.jaccard)
    copies = np.array([b for _, b in planted.pairs])
    assert set(range(80, 120)) <= kept  # the plain documents
    assert all(a in kept for a, _ in planted.pairs)
    assert not kept & set(copies[sims >= 0.9].tolist())
    assert set(copies[sims < 0.7].tolist()) <= kept


def test_work_of_another_signature_scheme_is_never_resumed(tmp_path: Path, write_jsonl) -> None:
    """A work folder or SLURM job left by an llmctl with other signatures (v1: no
    `signature_scheme` recorded) is recomputed or refused, never mixed with these."""
    from llmctl.data.dedup import plan, work_dir_for
    from llmctl.data.slurm import _save_job, load_job

    texts = ["a b c d e f g h", "a b c d e f g h i", "p q r s t u v w"]
    path = write_jsonl(tmp_path / "in.jsonl", texts)
    cfg = DedupConfig(inputs=[str(path)], output_dir=str(tmp_path / "o"), num_workers=1)
    chunks, scans = plan(cfg)
    old = work_dir_for(cfg)
    old.mkdir()
    params = {k: v for k, v in cfg.params().items() if k != "signature_scheme"}
    fingerprint = {
        "params": params,
        "inputs": [[str(s.path), s.sha256] for s in scans],
        "chunks": [[list(c.paths), c.start, c.end] for c in chunks],
    }
    (old / "plan.json").write_text(json.dumps(fingerprint))
    (old / "sig_000000.done.json").write_text('{"index": 0, "docs": 3, "bytes": 1}')
    (old / "sig_000000.arrays").write_bytes(b"v1 signatures")
    assert dedup(cfg).num_kept == 2  # recomputed: the old folder was discarded
    _save_job(tmp_path, cfg, chunks, scans)
    job = json.loads((tmp_path / "job.json").read_text())
    del job["signature_scheme"]
    (tmp_path / "job.json").write_text(json.dumps(job))
    with pytest.raises(UserError, match="signatures of scheme 'v1'"):
        load_job(tmp_path / "job.json")
