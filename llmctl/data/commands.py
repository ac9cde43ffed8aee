"""One library call per `llmctl data` command: the CLI parses, calls one of these, renders.

Each returns a JSON-ready dict and reports progress through a `ByteProgress` it is given (see
`llmctl.progress`), so the same functions serve scripts and the CLI.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.data.choices import Launcher
from llmctl.data.outputs import OutputLock
from llmctl.errors import UserError
from llmctl.staging import (
    check_collisions,
    check_dir_target,
    check_file_targets,
    commit_dir,
    make_parent,
    new_stage,
    not_ours_error,
)

if TYPE_CHECKING:
    from llmctl.data.clean_config import CleanConfig
    from llmctl.data.dedup import DedupConfig
    from llmctl.data.preprocess import PreprocessConfig, ProgressUpdate
    from llmctl.progress import ByteProgress


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmRequest:
    """The SLURM side of a data command (launcher slurm)."""

    partition: str | None = None
    """SLURM partition; the cluster's default when unset."""
    max_parallel: int | None = None
    """At most this many array tasks at once (`--array=...%N`)."""
    print_script: bool = False
    """Render the sbatch scripts without submitting."""
    time_limit: str = "01:00:00"
    """Per-job time limit."""


def _slurm_options(req: SlurmRequest) -> Any:
    """The `data.slurm.SlurmOptions` of a request (imported here: SLURM code loads lazily)."""
    from llmctl.data.slurm import SlurmOptions

    return SlurmOptions(
        partition=req.partition, max_parallel=req.max_parallel, time_limit=req.time_limit
    )


def run_preprocess(
    cfg: PreprocessConfig,
    progress: ByteProgress,
    launcher: Launcher = Launcher.LOCAL,
    slurm: SlurmRequest | None = None,
) -> dict[str, Any]:
    """`llmctl data preprocess`: here, or as a SLURM array job plus a merge job."""
    if launcher is Launcher.SLURM:
        from llmctl.data.slurm import submit_preprocess

        req = slurm or SlurmRequest()
        return submit_preprocess(cfg, _slurm_options(req), render_only=req.print_script)
    from llmctl.data.preprocess import preprocess

    def update(u: ProgressUpdate) -> None:
        progress.update(
            total=u.total_bytes, num_bytes=u.num_bytes, docs=u.docs, tokens=u.tokens,
            resumed=u.resumed,
        )  # fmt: skip

    with progress:
        return preprocess(cfg, on_progress=update).as_dict()


def run_dedup(
    cfg: DedupConfig,
    progress: ByteProgress,
    launcher: Launcher = Launcher.LOCAL,
    slurm: SlurmRequest | None = None,
) -> dict[str, Any]:
    """`llmctl data dedup`: here, or as a SLURM array job plus a clustering job."""
    if launcher is Launcher.SLURM:
        from llmctl.data.slurm import submit_dedup

        req = slurm or SlurmRequest()
        return submit_dedup(cfg, _slurm_options(req), render_only=req.print_script)
    from llmctl.data.dedup import dedup

    def update(total: int, docs: int, num_bytes: int) -> None:
        progress.update(total=total, num_bytes=num_bytes, docs=docs)

    with progress:
        return dedup(cfg, on_progress=update).as_dict()


def run_clean(
    cfg: CleanConfig,
    progress: ByteProgress,
    launcher: Launcher = Launcher.LOCAL,
    slurm: SlurmRequest | None = None,
) -> dict[str, Any]:
    """`llmctl data clean`: here, or as a SLURM array job plus a join job."""
    if launcher is Launcher.SLURM:
        from llmctl.data.clean_slurm import submit_clean

        req = slurm or SlurmRequest()
        return submit_clean(cfg, _slurm_options(req), render_only=req.print_script)
    from llmctl.data.clean import run_clean as clean_here

    return clean_here(cfg, progress)


def run_tokenizer_train(
    inputs: list[str],
    out: str,
    *,
    force: bool = False,
    vocab_size: int = 4096,
    min_frequency: int = 2,
    text_field: str = "text",
    on_error: str = "fail",
) -> dict[str, Any]:
    """`llmctl data tokenizer train`: train into a staging folder, then move into `out`."""
    from llmctl.data.tokenizer import train_tokenizer

    if vocab_size < 257:
        raise UserError(
            f"--vocab-size must be >= 257 (256 byte tokens + <|endoftext|>), got {vocab_size}"
        )
    if min_frequency < 0:
        raise UserError(f"--min-frequency must be >= 0, got {min_frequency}")
    target = Path(out)
    check_dir_target(target, force, "tokenizer train")
    check_collisions(target, ["tokenizer.json", "tokenizer_config.json"])
    with OutputLock(target):
        stage = new_stage(target)
        try:
            summary = train_tokenizer(
                inputs, stage, vocab_size=vocab_size, text_field=text_field,
                min_frequency=min_frequency, on_error=on_error,
            )  # fmt: skip
            commit_dir(stage, target, "tokenizer train")
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    summary["tokenizer"] = str(target / "tokenizer.json")
    return summary


def run_corpus(out: str, *, max_docs: int = 400, force: bool = False) -> dict[str, Any]:
    """`llmctl data corpus`: the demo corpus as one JSONL file (refused if it exists, unless
    `force`)."""
    from llmctl.data.corpus import build_demo_corpus, is_demo_corpus

    if max_docs < 1:
        raise UserError(f"--max-docs must be >= 1, got {max_docs}")
    target = Path(out)
    check_file_targets([target], force, "the corpus")
    if target.exists() and not is_demo_corpus(target):
        raise not_ours_error(target)
    make_parent(target)
    with OutputLock(target):
        summary = build_demo_corpus(target, max_docs=max_docs)
    return {**summary, "out": str(target)}


def require_out(new: str | None, old: str | None, flag_old: str) -> str:
    """The output location from `--out` or its old spelling (kept for one release)."""
    if new and old and new != old:
        raise UserError(f"--out {new} and {flag_old} {old} disagree; pass --out only")
    value = new or old
    if not value:
        raise UserError("missing --out/-o: where to write the output")
    return value
