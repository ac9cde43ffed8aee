"""Run directories: one per run, holding everything needed to understand or resume it.

Layout::

    RUN_DIR/
      config.yaml       resolved config (llmctl.config.cfg_to_yaml; reload with load_resolved)
      plan.json         the plan the run used (llmctl.plan.PlanRecord, versioned), or {}
      metrics.jsonl     one JSON object per logged step (rank 0)
      perf.json/.md     predicted vs measured table, written at the end
      logs/             one log file per rank (rank0.log, ...)
      checkpoints/      checkpoints (issue 5), one subdirectory per saved step

Pure Python (no torch): the launcher calls `create_run_dir` before starting processes.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan.record import PlanRecord

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"


def require_run_dir(path: str | Path) -> Path:
    """Return `path` resolved if it is a run directory; the one "not a run directory" error.

    Every command that takes a run directory (resume, checkpoints, export, quantize, status,
    logs) calls this, so the condition is worded one way.

    Raises:
        UserError: `path` holds no config.yaml.
    """
    run_dir = Path(path).expanduser()
    if not (run_dir / CONFIG_FILE).is_file():
        what = "does not exist" if not run_dir.exists() else f"has no {CONFIG_FILE}"
        raise UserError(f"{path} is not a run directory ({what}); start one with `llmctl train`")
    return run_dir.resolve()


def absolute_paths(cfg: RootConfig) -> RootConfig:
    """The config with its file paths made absolute (relative ones are taken from the cwd).

    Used when a run is prepared, so its config.yaml works from any directory and after the
    run directory is moved: data.prefixes, data.tokenizer, data.cache_dir, launcher.hostfile.
    An unset data.tokenizer is pinned to the one the datasets' manifests record (which
    `llmctl data preprocess` writes as typed, often relative). Returns a copy; `cfg` is left
    as it is.
    """

    def fix(value: str | None) -> str | None:
        return None if not value else os.path.abspath(os.path.expanduser(value))

    prefixes = [os.path.abspath(os.path.expanduser(p)) if p else p for p in cfg.data.prefixes]
    data = replace(
        cfg.data,
        prefixes=prefixes,
        tokenizer=fix(cfg.data.tokenizer) or _manifest_tokenizer(prefixes),
        cache_dir=fix(cfg.data.cache_dir),
    )
    launcher = replace(cfg.launcher, hostfile=fix(cfg.launcher.hostfile))
    return replace(cfg, data=data, launcher=launcher)


def _manifest_tokenizer(prefixes: list[str]) -> str | None:
    """The tokenizer.json the datasets were preprocessed with, as an absolute path.

    `llmctl data preprocess` records the tokenizer path as it was typed (often relative). None
    unless every prefix records the same Hugging Face tokenizer file and it exists from here.
    """
    from llmctl.run.data import manifest_tokenizer

    found = [manifest_tokenizer(p) for p in prefixes]
    records = [r for r in found if r is not None]
    if not records or len(records) != len(found):
        return None
    if len({r.get("sha256") for r in records}) != 1 or records[0].get("kind") != "hf":
        return None
    path = Path(str(records[0].get("path", ""))).expanduser()
    return os.path.abspath(path) if path.is_file() else None


def default_run_dir(recipe: str, now: datetime | None = None, root: Path = Path("runs")) -> Path:
    """runs/<recipe>-<UTC timestamp>, e.g. runs/tiny_cpu-20261130T041500Z."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{recipe or 'run'}-{stamp}"


def create_run_dir(cfg: RootConfig, plan: PlanRecord | None) -> Path:
    """Create the run directory and write config.yaml and plan.json into it.

    Args:
        cfg: The resolved `RootConfig`. `cfg.train.run_dir` None = `default_run_dir(cfg.recipe)`;
            the chosen path is stored back into `cfg.train.run_dir` before it is written.
        plan: The plan to record (layout, predictions), or None (plan.json is then `{}`).

    Returns:
        The run directory path.
    """
    from llmctl.config import cfg_to_yaml

    run_dir = Path(cfg.train.run_dir) if cfg.train.run_dir else default_run_dir(cfg.recipe)
    cfg.train.run_dir = str(run_dir)
    for sub in ("", LOGS_DIR, CHECKPOINTS_DIR):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(cfg_to_yaml(cfg))
    body = plan.file_dict() if plan is not None else {}
    (run_dir / PLAN_FILE).write_text(json.dumps(body, indent=2, default=str) + "\n")
    return run_dir


def read_plan(run_dir: Path) -> PlanRecord | None:
    """The plan of a run directory, as any llmctl version wrote it (None when absent or `{}`).

    Raises:
        UserError: plan.json is not JSON, is from a newer llmctl, or is malformed.
    """
    from llmctl.plan.record import PlanRecord

    path = run_dir / PLAN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text() or "{}")
        return PlanRecord.from_dict(data) if isinstance(data, dict) else None
    except ValueError as exc:
        raise UserError(f"{path}: not a plan written by `llmctl train` ({exc})") from None
