"""Recipes and configs work from an installed wheel, not only from a checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_carries_configs_and_recipes(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("llmctl-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(site)
    assert "llmctl/_resources/recipes/tiny_cpu.yaml" in names
    assert "llmctl/_resources/configs/model/tiny.yaml" in names
    code = (
        "import llmctl.config as c, pathlib; "
        "print(c.resource_dir('recipes')); "
        "print(c.compose('tiny_cpu').model.name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    where, model = out.stdout.split()
    assert where.startswith(str(site)) and model == "tiny"
