"""`cluster=probe` on a CPU host: the torch probe (GEMM, copy, per-op cost), its cache, and
the cluster fields made from it (llmctl.topology.cpu_probe). Real measurements of this host,
in a child process, each a warm-up and a measuring window (3 s) after torch's import."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llmctl.topology.cpu_probe import (
    REFERENCE_OP_US,
    WARMUP_S,
    WINDOW_S,
    cache_path,
    measure_cpu,
    probed_cpu_fields,
)

#: The probe's warm-up and window, plus setup and its last round on a loaded host.
PROBE_S = WARMUP_S + WINDOW_S + 2.5


def test_probe_measures_once_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("LLMCTL_CPU_PROBE_REFRESH", raising=False)
    first = measure_cpu("Test CPU", 1)
    assert first["gemm_gflops"] > 0.1 and first["copy_gb_s"] > 0.1 and first["op_us"] > 0
    assert first["threads"] == 1 and first["probe_s"] < PROBE_S, first
    path = cache_path("Test CPU", 1)
    assert path.is_file() and path.is_relative_to(tmp_path / "llmctl" / "cpu_probe")
    t = time.perf_counter()
    assert measure_cpu("Test CPU", 1) == first  # from the cache: no second measurement
    assert time.perf_counter() - t < 0.5
    # another kernel capability is another measurement (and another cache file); a torn
    # cache file there is measured again and replaced
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    other = cache_path("Test CPU", 1)
    assert other != path
    other.write_text('{"gemm_gfl')
    avx2 = measure_cpu("Test CPU", 1)
    assert avx2["capability"] == "AVX2" and json.loads(other.read_text()) == avx2
    assert avx2["probe_s"] < PROBE_S
    # a measurement of the probe before its window (no `window_s`) is measured again
    other.write_text('{"gemm_gflops": 1.0, "copy_gb_s": 1.0, "op_us": 99.0}')
    again = measure_cpu("Test CPU", 1)
    assert "window_s" in again and json.loads(other.read_text()) == again


def test_fields_price_the_fixed_costs_at_the_per_op_cost() -> None:
    from llmctl.topology.cpu_probe import CHUNK_OPS, LAYER_OPS, STEP_OPS

    knobs = {"layer_overhead_us": 1.0, "p2p_latency_us": 400.0, "elementwise_passes": 3.0}
    one = {"gemm_gflops": 50.0, "copy_gb_s": 20.0, "op_us": REFERENCE_OP_US}
    two = {**one, "op_us": 2 * REFERENCE_OP_US}
    a, b = probed_cpu_fields(one, knobs), probed_cpu_fields(two, knobs)
    assert a["peak_tflops"] == {"fp32": 0.05} and a["achievable_fraction"] == {"fp32": 1.0}
    assert a["hbm_bandwidth_gb_s"] == 20.0
    ea, eb = a["efficiency"], b["efficiency"]
    assert ea["layer_overhead_us"] == pytest.approx(LAYER_OPS * REFERENCE_OP_US, rel=1e-6)
    assert ea["chunk_overhead_us"] == pytest.approx(CHUNK_OPS * REFERENCE_OP_US, rel=1e-6)
    assert ea["step_overhead_s"] == pytest.approx(STEP_OPS * REFERENCE_OP_US * 1e-6, rel=1e-4)
    assert ea["p2p_latency_us"] == pytest.approx(400.0)
    for key in ("layer_overhead_us", "chunk_overhead_us", "step_overhead_s", "p2p_latency_us"):
        assert eb[key] == pytest.approx(2 * ea[key], rel=1e-4)  # a host twice as slow per op
    assert eb["elementwise_passes"] == 3.0  # a software property: not scaled
