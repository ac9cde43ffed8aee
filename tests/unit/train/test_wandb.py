"""Weights & Biases for real (wandb installed, offline mode): one W&B run per llmctl run,
continued across a resume, with the schema's project and tags; the off state said out loud.

The oracle is what wandb itself wrote: its offline run directories and the protobuf records in
each `run-<id>.wandb` file (W&B's LevelDB-style log, decoded with wandb's own `Record` schema).
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("wandb")

from llmctl.config import compose

BLOCK = 32768  # W&B's log block size; every record chunk has a 7-byte header


def _records(path: Path) -> list[Any]:
    """Every protobuf `Record` in a `.wandb` file (header ':W&B' + magic + version)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # block trailer padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _history(path: Path) -> dict[int, float]:
    steps = {}
    for rec in _records(path):
        if rec.WhichOneof("record_type") == "history":
            row = {
                i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item
            }
            if "loss" in row:
                steps[int(row["_step"])] = float(row["loss"])
    return steps


def _cfg(demo_cache: Path, run_dir: Path, iters: int, *extra: str):
    return compose(
        "tiny_cpu",
        [
            f"data.cache_dir={demo_cache}",
            f"train.run_dir={run_dir}",
            f"train.train_iters={iters}",
            "train.eval_interval=0",
            "checkpoint.interval=3",
            "checkpoint.async_save=false",
            *extra,
        ],
    )


def _train(cfg, run_dir: Path):
    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import make_checkpointer

    return run_in_process(cfg, run_dir, checkpointer=make_checkpointer(cfg, run_dir))


def test_one_wandb_run_continued_across_resume(
    demo_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    one_thread: None,
) -> None:
    monkeypatch.delenv("LLMCTL_WANDB", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "run"
    extra = ("train.wandb.project=llmctl-test", "train.wandb.tags=[cpu,tiny]")
    _train(_cfg(demo_cache, run_dir, 3, *extra), run_dir)
    _train(_cfg(demo_cache, run_dir, 6, *extra), run_dir)  # resumes from step 3
    assert "wandb:" not in "".join(capfd.readouterr())  # wandb's banner: not on the console

    run_id = (run_dir / "wandb_run_id").read_text().strip()
    dirs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in dirs)
    files = [d / f"run-{run_id}.wandb" for d in dirs]
    runs = [r.run for f in files for r in _records(f) if r.WhichOneof("record_type") == "run"]
    assert {r.run_id for r in runs} == {run_id}
    assert {r.project for r in runs} == {"llmctl-test"}
    assert all(list(r.tags) == ["cpu", "tiny"] for r in runs)
    logged = {**_history(files[0]), **_history(files[1])}
    assert sorted(_history(files[1])) == [4, 5, 6]  # the second process continued the steps
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == {m["step"]: pytest.approx(m["loss"]) for m in metrics}


def test_tracking_off_is_said(
    demo_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    one_thread: None,
) -> None:
    monkeypatch.delenv("LLMCTL_WANDB", raising=False)
    run_dir = tmp_path / "off"
    cfg = _cfg(demo_cache, run_dir, 1, "train.wandb.mode=disabled", "checkpoint.interval=0")
    with caplog.at_level(logging.INFO, logger="llmctl.train"):
        _train(cfg, run_dir)
    assert "W&B tracking off (train.wandb.mode=disabled)" in caplog.text
    assert not (run_dir / "wandb").exists() and not (run_dir / "wandb_run_id").exists()
