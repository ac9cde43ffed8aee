"""Upload throughput of a checkpoint to S3: llmctl's uploader vs boto3's own multipart upload.

Both sides upload the same bytes to the same server in the same run: a checkpoint directory of
`--files` shards (random bytes, `--mib` MiB in all) plus the small JSON files, committed
locally with llmctl's protocol. Side A is what training does after a local commit
(`ckpt_upload.Uploader`: pending marker, parallel multipart upload through boto3's transfer
manager, conditional-PUT commit marker, `latest`, retention); side B is boto3's
`S3Transfer.upload_file` of the same files, one after the other, with boto3's default
`TransferConfig` (what a user of boto3 gets). Reported: seconds and MiB/s of each, their
ratio, and the uploader's CPU seconds (process time). The server is a SeaweedFS started here
(`benchmarks/s3_server.py`) unless the AWS_* variables and `--url` name another.

`--blocked`: instead, training-blocked time of a save with `checkpoint.dir=s3://...` (the
local async snapshot; the upload runs in the background) vs a synchronous save of the same
state to the same server (local sync save, then waiting for its upload), in one in-process
training run of benchmarks/ckpt_async.py's ~100M-parameter model (~1.1 GiB of model + Adam
state), interleaved, medians reported.

`--restart`: a replacement node's restart. The same model trains 2 steps and commits them twice,
once to the store and once to a local checkpoint dir; then, alternating, a run in a new, empty
run dir with `checkpoint.dir=s3://...` (what a node that never saw the run does: download and
load) and a run resuming from the local dir train step 3. Reported per side: seconds from the
start of the in-process run to the end of the first resumed step (model build, data, checkpoint
load, one step; the interpreter and torch import are warm and the same for both), and the
seconds inside the checkpoint load.

Run: `.venv/bin/python benchmarks/s3_checkpoint.py --mib 1024 --repeats 3 --json`,
`.venv/bin/python benchmarks/s3_checkpoint.py --blocked --json`,
`.venv/bin/python benchmarks/s3_checkpoint.py --restart --repeats 2 --json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_checkpoint(run_dir: Path, step: int, mib: int, files: int) -> Path:
    """A committed local checkpoint of `mib` MiB in `files` shards (llmctl's protocol)."""
    from llmctl.run import ckpt_store as store

    root = run_dir / "checkpoints"
    tmp = store.staging_dir(root, step)
    (tmp / store.RNG_DIR).mkdir(parents=True)
    each = (mib << 20) // files
    chunk = os.urandom(1 << 20)
    for i in range(files):
        with open(tmp / f"__0_{i}.distcp", "wb") as f:
            for _ in range(each >> 20):
                f.write(chunk)
    (tmp / store.RNG_DIR / "rank_0.json").write_text("{}")
    store.write_rank_marker(tmp, 0, store.rank_files(tmp, 0))
    (tmp / "metadata.json").write_text("{}")
    (tmp / store.TRAIN_STATE).write_text(json.dumps({"step": step}))
    (tmp / ".metadata").write_bytes(b"x")
    manifest = store.build_manifest(tmp, 1, {"step": step, "world_size": 1})
    return store.commit(root, tmp, step, manifest)


def upload_llmctl(
    url: str, run_dir: Path, step: int, part_bytes: int | None = None
) -> tuple[float, float]:
    """(wall s, CPU s) of the trainer's background upload of one committed checkpoint."""
    from llmctl.run.ckpt_upload import Uploader

    up = Uploader(
        url, run_dir, timeout_s=120, keep_local=True, keep_last=100, keep_every=None,
        part_bytes=part_bytes,
    )  # fmt: skip
    t0, c0 = time.perf_counter(), time.process_time()
    up.start(step)
    up.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    outcome = up.take()
    assert outcome is not None and outcome.error is None, outcome
    return wall, cpu


def upload_boto3(url: str, ckpt: Path, prefix: str) -> tuple[float, float]:
    """(wall s, CPU s) of boto3's `upload_file` of every file of `ckpt` (default config)."""
    from boto3.s3.transfer import S3Transfer

    from llmctl.run.storage_s3 import client, parse_location

    where = parse_location(url)
    transfer = S3Transfer(client())
    t0, c0 = time.perf_counter(), time.process_time()
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        key = f"{where.prefix}/{prefix}/{path.relative_to(ckpt).as_posix()}"
        transfer.upload_file(str(path), where.bucket, key)
    return time.perf_counter() - t0, time.process_time() - c0


def blocked(url: str, work: Path, samples: int, hidden: int) -> dict[str, object]:
    """Blocked ms of s3 saves vs total ms of synchronous saves to the store (same run)."""
    import statistics
    from argparse import Namespace
    from dataclasses import replace

    from ckpt_async import _cfg, _corpus

    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import DistCheckpointer

    prefix = work / "data" / "corpus"
    prefix.parent.mkdir(parents=True)
    _corpus(prefix)
    args = Namespace(layers=4, hidden=hidden, vocab=16384, activation="swiglu")
    cfg = _cfg(args, prefix, 1 + 2 * samples)
    cfg = replace(cfg, checkpoint=replace(cfg.checkpoint, dir=url, keep_last=2))
    run_dir = work / "blocked-run"
    out: dict[str, list[float]] = {"s3_blocked_ms": [], "s3_total_ms": [], "sync_store_ms": []}
    cpu: dict[str, list[float]] = {"s3": [], "sync": []}

    class Bench(DistCheckpointer):
        def after_step(self, state: object) -> None:
            s = state.step  # type: ignore[attr-defined]
            t0, c0 = time.perf_counter(), time.process_time()
            if s == 1:
                self.save(state, use_async=False)  # warm-up (first save of the process)
                self.wait()
            elif s % 2 == 0:
                self.save(state, use_async=False)
                self.wait()
                out["sync_store_ms"].append(1e3 * (time.perf_counter() - t0))
                cpu["sync"].append(time.process_time() - c0)
            else:
                self.save(state, use_async=True)
                out["s3_blocked_ms"].append(1e3 * (time.perf_counter() - t0))
                self.wait()
                out["s3_total_ms"].append(1e3 * (time.perf_counter() - t0))
                cpu["s3"].append(time.process_time() - c0)

    run_in_process(cfg, run_dir, checkpointer=Bench(cfg, run_dir))
    from llmctl.run import ckpt_store as store

    state_bytes = store.list_checkpoints(Path(url))[0].size_bytes  # the newest, in the store
    med = {k: statistics.median(v) for k, v in out.items()}
    return {
        "state_bytes": state_bytes,
        **{k: round(v, 1) for k, v in med.items()},
        "samples": {k: [round(x, 1) for x in v] for k, v in out.items()},
        "cpu_s": {k: [round(x, 2) for x in v] for k, v in cpu.items()},
        "blocked_ratio": round(med["s3_blocked_ms"] / med["sync_store_ms"], 4),
    }


def restart(url: str, work: Path, repeats: int, hidden: int) -> dict[str, object]:
    """Seconds to the first resumed step: from the store in an empty run dir vs local disk."""
    import shutil
    import statistics
    from argparse import Namespace
    from dataclasses import replace

    from ckpt_async import _cfg, _corpus

    from llmctl.run import ckpt_store as store
    from llmctl.train import run_in_process
    from llmctl.train.checkpoint import DistCheckpointer

    prefix = work / "data" / "corpus"
    prefix.parent.mkdir(parents=True)
    _corpus(prefix)
    args = Namespace(layers=4, hidden=hidden, vocab=16384, activation="swiglu")
    local_root = work / "local-run" / "checkpoints"

    def cfg_for(iters: int, where: str | None) -> object:  # None: RUN_DIR/checkpoints
        cfg = _cfg(args, prefix, iters)
        ck = replace(cfg.checkpoint, dir=where, interval=2, keep_last=2, async_save=False)
        return replace(cfg, checkpoint=ck)

    times: dict[str, float] = {}

    class Timed(DistCheckpointer):
        def load(self, state: object) -> None:
            t0 = time.perf_counter()
            super().load(state)
            times["load_s"] = time.perf_counter() - t0

        def after_step(self, state: object) -> None:
            times.setdefault("first_step_at", time.perf_counter())
            super().after_step(state)

    def timed_run(cfg: object, run_dir: Path) -> dict[str, float]:
        times.clear()
        t0 = time.perf_counter()
        run_in_process(cfg, run_dir, checkpointer=Timed(cfg, run_dir))  # type: ignore[arg-type]
        return {"first_step_s": times["first_step_at"] - t0, "load_s": times["load_s"]}

    run_in_process(cfg_for(2, None), work / "local-run")  # type: ignore[arg-type]
    pristine = work / "local-pristine"
    shutil.copytree(local_root, pristine)
    out: dict[str, list[dict[str, float]]] = {"store": [], "local": []}
    state_bytes = 0
    for rep in range(repeats):
        where = f"{url}/r{rep}"  # the end of training saves step 3: a fresh prefix per round
        run_in_process(cfg_for(2, where), work / f"seed{rep}")  # type: ignore[arg-type]
        state_bytes = store.list_checkpoints(Path(where))[0].size_bytes
        out["store"].append(timed_run(cfg_for(3, where), work / f"replacement{rep}"))
        shutil.rmtree(local_root)
        shutil.copytree(pristine, local_root)  # step 3 saved nothing the next round sees
        out["local"].append(timed_run(cfg_for(3, None), work / "local-run"))
    med = {
        f"{side}_{k}": round(statistics.median(r[k] for r in rows), 2)
        for side, rows in out.items()
        for k in ("first_step_s", "load_s")
    }
    return {
        "state_bytes": state_bytes,
        **med,
        "ratio_first_step": round(med["store_first_step_s"] / med["local_first_step_s"], 2),
        "samples": {k: [{m: round(x, 2) for m, x in r.items()} for r in v] for k, v in out.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: start a server (unless --url), run both sides --repeats times, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--url", default=None, help="s3://BUCKET/PREFIX (AWS_* set); default: own")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--blocked", action="store_true", help="training-blocked time instead")
    ap.add_argument("--part-mib", type=int, default=None, help="uploader part size (MiB)")
    ap.add_argument("--restart", action="store_true", help="replacement-node restart instead")
    ap.add_argument("--hidden", type=int, default=1024, help="--blocked/--restart: hidden size")
    ns = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmctl-s3-bench-"))
    server = None
    url = ns.url
    if url is None:
        from s3_server import BUCKET, WeedServer

        server = WeedServer(work / "seaweedfs")
        server.start()
        os.environ.update(server.env())
        url = f"s3://{BUCKET}/bench"
    try:
        if ns.blocked or ns.restart:
            bench = restart if ns.restart else blocked
            result = bench(url, work, ns.repeats, ns.hidden)
            print(json.dumps(result, indent=2))
            return 0
        rows = []
        for rep in range(ns.repeats):
            run_dir = work / f"run{rep}"
            ckpt = make_checkpoint(run_dir, rep + 1, ns.mib, ns.files)
            nbytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
            b_wall, b_cpu = upload_boto3(url, ckpt, f"boto3-{rep}")
            part = ns.part_mib << 20 if ns.part_mib else None
            a_wall, a_cpu = upload_llmctl(url, run_dir, rep + 1, part)
            rows.append(
                {
                    "bytes": nbytes,
                    "llmctl_s": round(a_wall, 3),
                    "llmctl_cpu_s": round(a_cpu, 3),
                    "boto3_s": round(b_wall, 3),
                    "boto3_cpu_s": round(b_cpu, 3),
                    "llmctl_mib_s": round(nbytes / a_wall / (1 << 20), 1),
                    "boto3_mib_s": round(nbytes / b_wall / (1 << 20), 1),
                    "throughput_ratio": round(b_wall / a_wall, 3),
                }
            )
    finally:
        if server is not None:
            server.stop()
    best = max(rows, key=lambda r: r["throughput_ratio"])
    worst = min(rows, key=lambda r: r["throughput_ratio"])
    report = {
        "mib": ns.mib,
        "files": ns.files,
        "rows": rows,
        "ratio_min": worst["throughput_ratio"],
        "ratio_max": best["throughput_ratio"],
    }
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        for r in rows:
            print(
                f"{r['bytes'] / (1 << 20):.0f} MiB: llmctl {r['llmctl_s']} s "
                f"({r['llmctl_mib_s']} MiB/s, CPU {r['llmctl_cpu_s']} s), boto3 upload_file "
                f"{r['boto3_s']} s ({r['boto3_mib_s']} MiB/s); ratio {r['throughput_ratio']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
