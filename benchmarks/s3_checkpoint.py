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

Run: `.venv/bin/python benchmarks/s3_checkpoint.py --mib 1024 --repeats 3 --json`.
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


def upload_llmctl(url: str, run_dir: Path, step: int) -> tuple[float, float]:
    """(wall s, CPU s) of the trainer's background upload of one committed checkpoint."""
    from llmctl.run.ckpt_upload import Uploader

    up = Uploader(url, run_dir, timeout_s=120, keep_local=True, keep_last=100, keep_every=None)
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


def main(argv: list[str] | None = None) -> int:
    """CLI: start a server (unless --url), run both sides --repeats times, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--url", default=None, help="s3://BUCKET/PREFIX (AWS_* set); default: own")
    ap.add_argument("--json", action="store_true")
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
        rows = []
        for rep in range(ns.repeats):
            run_dir = work / f"run{rep}"
            ckpt = make_checkpoint(run_dir, rep + 1, ns.mib, ns.files)
            nbytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
            b_wall, b_cpu = upload_boto3(url, ckpt, f"boto3-{rep}")
            a_wall, a_cpu = upload_llmctl(url, run_dir, rep + 1)
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
