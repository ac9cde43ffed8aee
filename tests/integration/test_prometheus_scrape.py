"""A real `llmctl train` run (tiny_cpu, DP=2 under torchrun, CPU) with metrics on, scraped by a
real Prometheus server and pushing to a real Pushgateway (Debian 12's, from
scripts/prometheus_local.sh; `make test` installs them, the test skips only without them).

Through Prometheus' HTTP API: the step of both ranks while the run trains, the measured step
time beside the plan's predicted one (equal to metrics.jsonl and plan.json), the per-rank step
time from the histogram; after the run the final push (step, step time, committed checkpoint)
both through Prometheus and from the Pushgateway itself; the shipped rules loaded and healthy;
and `llmctl status --json` showing the same numbers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prom_support import free_ports, http_get, prometheus, pushgateway

from llmctl.run.prom import alert_rules_path

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

STEPS = 30


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llmctl.data.demo import prepare_demo_data

    cache = tmp_path_factory.mktemp("demo-cache")
    prepare_demo_data(cache)
    return cache


def _train(
    run_dir: Path, port: int, gateway: str, cache: Path, log: Path
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "llmctl", "train", "recipe=tiny_cpu", "parallel.dp=2",
        f"train.train_iters={STEPS}", "train.eval_interval=0", "checkpoint.interval=10",
        f"train.metrics.port={port}", f"train.metrics.pushgateway={gateway}",
        "train.metrics.push_interval_s=2", f"data.cache_dir={cache}", f"train.run_dir={run_dir}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LLMCTL_WANDB": "off"}
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip


def _by_rank(result: list[dict]) -> dict[str, float]:
    return {r["metric"]["rank"]: r["value"] for r in result}


def test_a_real_run_is_scraped_and_pushed(tmp_path: Path, demo_cache: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    gateway_port, prom_port, port, _ = free_ports(4)  # rank r serves port + r
    targets = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    with (
        pushgateway(tmp_path, gateway_port) as gateway,
        prometheus(tmp_path, prom_port, targets, gateway, alert_rules_path()) as prom,
    ):
        proc = _train(run_dir, port, gateway, demo_cache, log)
        try:
            live = prom.wait_for(
                'llmctl_train_step{job="llmctl-train"}',
                lambda r: len(r) == 2 and min(x["value"] for x in r) >= 3,
            )
            up = {x["metric"]["instance"]: x["value"] for x in prom.query('up{job="llmctl-train"}')}
            targets_now = prom.api("targets")["activeTargets"]
            measured = _by_rank(prom.query('llmctl_train_last_step_seconds{job="llmctl-train"}'))
            predicted = prom.query('llmctl_plan_step_seconds{job="llmctl-train"}')
            ratio = prom.query(
                'max by (run) (llmctl_train_last_step_seconds{job="llmctl-train"})'
                ' / on (run) llmctl_plan_step_seconds{job="llmctl-train"}'
            )
            mean = _by_rank(prom.wait_for(
                'sum by (rank) (rate(llmctl_train_step_seconds_sum{job="llmctl-train"}[20s]))'
                ' / sum by (rank) (rate(llmctl_train_step_seconds_count{job="llmctl-train"}[20s]))',
                lambda r: len(r) == 2,
            ))  # fmt: skip
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == 0, log.read_text()[-3000:]
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        plan = json.loads((run_dir / "plan.json").read_text())
        step_times = {r["step_time_s"] for r in records}

        assert "cannot serve metrics" not in log.read_text()
        assert {x["metric"]["run"] for x in live} == {"run"}
        assert {x["metric"]["instance"] for x in live} == set(targets)
        for x in live:
            assert x["metric"]["instance"] == targets[int(x["metric"]["rank"])]
            assert "exported_job" not in x["metric"]
        assert up == dict.fromkeys(targets, 1.0), targets_now
        assert measured.keys() == {"0", "1"} and measured["0"] in step_times
        assert [p["value"] for p in predicted] == [plan["step_time_s"]]  # rank 0 only
        assert predicted[0]["metric"]["rank"] == "0"
        assert ratio[0]["value"] == pytest.approx(max(measured.values()) / plan["step_time_s"])
        assert all(0 < m < 60 for m in mean.values())

        # The final push (after the last step and the final checkpoint), through Prometheus...
        final = prom.wait_for(
            'llmctl_train_step{job="llmctl"}',
            lambda r: len(r) == 2 and all(x["value"] == STEPS for x in r),
        )
        assert {x["metric"]["rank"] for x in final} == {"0", "1"}
        pushed = _by_rank(prom.query('llmctl_train_last_step_seconds{job="llmctl"}'))
        assert pushed["0"] == records[-1]["step_time_s"]
        ckpt = _by_rank(prom.query('llmctl_checkpoint_last_step{job="llmctl"}'))
        assert ckpt == {"0": STEPS, "1": STEPS}
        blocked = prom.query('llmctl_checkpoint_saves_total{job="llmctl",rank="0"}')
        assert blocked[0]["value"] == STEPS // 10
        # ...and from the Pushgateway itself.
        text = http_get(f"{gateway}/metrics").decode()
        line = next(x for x in text.splitlines() if x.startswith("llmctl_train_step{"))
        assert 'job="llmctl"' in line and 'run="run"' in line and line.endswith(f" {STEPS}")

        rules = prom.api("rules")["groups"][0]["rules"]
        assert len(rules) == 8 and {r["health"] for r in rules} == {"ok"}

    status = subprocess.run(
        [sys.executable, "-m", "llmctl", "status", str(run_dir), "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    shown = json.loads(status.stdout)["metrics"]
    assert shown["llmctl_train_step"] == STEPS
    assert shown["llmctl_train_last_step_seconds"] == pushed["0"]
    assert shown["llmctl_plan_step_seconds"] == predicted[0]["value"]
    assert shown["llmctl_run_restarts"] == 0
    print(json.dumps({"up": up, "live": live, "measured": measured, "predicted": predicted,
                      "ratio": ratio, "mean": mean, "final": final}, indent=1))  # fmt: skip
