"""A real Prometheus server and Pushgateway for the tests (Debian 12's, unpacked by
scripts/prometheus_local.sh): started on 127.0.0.1 with free ports, stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml


def find_binary(name: str) -> str | None:
    """A Prometheus binary: $LLMCTL_PROMETHEUS_DIR/usr/bin, /opt/llmctl-prometheus/usr/bin, PATH."""
    for root in (os.environ.get("LLMCTL_PROMETHEUS_DIR"), "/opt/llmctl-prometheus"):
        if root and (Path(root) / "usr/bin" / name).is_file():
            return str(Path(root) / "usr/bin" / name)
    return shutil.which(name)


def require_binary(name: str) -> str:
    path = find_binary(name)
    if path is None:
        pytest.skip(f"{name} not installed: run scripts/prometheus_local.sh (make test does)")
    return path


def free_ports(n: int) -> list[int]:
    """n consecutive free TCP ports on 127.0.0.1 (take every port a test needs in one call:
    the search is deterministic, so a second call before the first ports are bound repeats
    them)."""
    for base in range(20000 + os.getpid() % 20000, 60000, 7):
        if all(_free(base + i) for i in range(n)):
            return [base + i for i in range(n)]
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_get(url: str, timeout: float = 10) -> bytes:
    """GET a URL; an HTTP error carries the server's body (PromQL errors say why there)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bytes(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"GET {url}: {e.code} {e.read().decode(errors='replace')}") from None


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{proc.args[0]} exited {proc.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            http_get(url, timeout=2)
            return
        except (OSError, AssertionError):
            # not listening yet, or up and answering 503 while it loads its TSDB and rules
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s} s: {log.read_text()[-2000:]}")


@contextmanager
def _daemon(argv: list[str], ready_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(ready_url, proc, log)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def pushgateway(tmp: Path, port: int) -> Iterator[str]:
    """A Pushgateway on 127.0.0.1:port; yields its URL."""
    binary = require_binary("prometheus-pushgateway")
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}"]
    with _daemon(argv, f"{url}/-/ready", tmp / "pushgateway.log"):
        yield url


class Prometheus:
    """A running server's HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        body = json.loads(http_get(f"{self.url}/api/v1/{path}?{query}"))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query: [{'metric': labels, 'value': float}]."""
        data = self.api("query", query=promql)
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def wait_for(self, promql: str, ok: Any, timeout_s: float = 240) -> list[dict[str, Any]]:
        """Poll an instant query until `ok(result)`; the last result on timeout (assert)."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if ok(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{promql}: {result} after {timeout_s} s")


@contextmanager
def prometheus(
    tmp: Path, port: int, targets: list[str], pushgateway_url: str | None, rules: Path
) -> Iterator[Prometheus]:
    """A Prometheus scraping `targets` (host:port, job llmctl-train) and the Pushgateway
    (honor_labels, job pushgateway) every second, with the shipped rules loaded."""
    binary = require_binary("prometheus")
    scrape = [{"job_name": "llmctl-train", "static_configs": [{"targets": targets}]}]
    if pushgateway_url:
        gateway = pushgateway_url.removeprefix("http://")
        scrape.append(
            {
                "job_name": "pushgateway",
                "honor_labels": True,
                "static_configs": [{"targets": [gateway]}],
            }
        )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": scrape,
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    argv = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with _daemon(argv, f"{url}/-/ready", tmp / "prometheus.log"):
        yield Prometheus(url)
