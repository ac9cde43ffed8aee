"""The shipped alert rules (configs/monitoring/llmctl-alerts.yml) under `promtool`.

Each rule has one `promtool test rules` file in rules/ that feeds it series of a healthy run
and of a sick one and expects, at an evaluation time before the threshold, no alert, and after
it, exactly the sick run's alert (labels and annotations). promtool is Debian 12's, unpacked by
scripts/prometheus_local.sh (which `make test` runs); the tests skip only when it is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmctl.run.prom import alert_rules_path

RULES_DIR = Path(__file__).parent / "rules"
TESTS = sorted(RULES_DIR.glob("*.test.yml"))


def find_binary(name: str) -> str | None:
    """A Prometheus binary: $LLMCTL_PROMETHEUS_DIR/usr/bin, /opt/llmctl-prometheus/usr/bin, PATH."""
    for root in (os.environ.get("LLMCTL_PROMETHEUS_DIR"), "/opt/llmctl-prometheus"):
        if root and (Path(root) / "usr/bin" / name).is_file():
            return str(Path(root) / "usr/bin" / name)
    return shutil.which(name)


@pytest.fixture(scope="module")
def promtool() -> str:
    path = find_binary("promtool")
    if path is None:
        pytest.skip("promtool not installed: run scripts/prometheus_local.sh (make test does)")
    return path


def _promtool(promtool: str, *args: str | Path, cwd: Path = RULES_DIR) -> str:
    proc = subprocess.run(
        [promtool, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def test_rules_file_is_valid(promtool: str) -> None:
    out = _promtool(promtool, "check", "rules", alert_rules_path())
    assert "SUCCESS: 8 rules found" in out


@pytest.mark.parametrize("test_file", TESTS, ids=[t.name.split(".")[0] for t in TESTS])
def test_rule(promtool: str, test_file: Path) -> None:
    assert "SUCCESS" in _promtool(promtool, "test", "rules", test_file.name)


def test_every_alert_is_tested_firing_and_not() -> None:
    alerts = {
        r["alert"]
        for g in yaml.safe_load(alert_rules_path().read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        spec = yaml.safe_load(path.read_text())
        assert spec["rule_files"] == ["../../../../configs/monitoring/llmctl-alerts.yml"]
        for test in spec["tests"]:
            for case in test["alert_rule_test"]:
                (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    assert alerts == firing == quiet


def test_a_wrong_threshold_fails_its_test(promtool: str, tmp_path: Path) -> None:
    """The harness can fail: the stall rule at 100 min instead of 10 does not fire at 18 min."""
    rules = alert_rules_path().read_text()
    assert "> 600\n" in rules
    (tmp_path / "rules.yml").write_text(rules.replace("> 600\n", "> 6000\n"))
    spec = yaml.safe_load((RULES_DIR / "stalled.test.yml").read_text())
    spec["rule_files"] = ["rules.yml"]
    (tmp_path / "t.test.yml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run(
        [promtool, "test", "rules", "t.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "LlmctlTrainingStalled" in proc.stdout + proc.stderr
