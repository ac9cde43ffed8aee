"""Re-entering a run directory (`resume`, `train` into an existing run dir), checked up front.

The run directory here holds real megatron-core checkpoints, trained once per module in this
process (`run_in_process`); each test works on a copy. Every refusal must come before any rank
starts and before anything in the run directory changes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.run import ckpt_store as store

pytest.importorskip("megatron.core")

runner = CliRunner()
ITERS = 4


@pytest.fixture
def llmctl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run the console entry point in this process: (exit code, stdout, stderr)."""
    from llmctl.cli.main import main

    def call(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["llmctl", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        out = capsys.readouterr()
        return int(exit_.value.code or 0), out.out, out.err

    return call


def _corpus(prefix: Path) -> Path:
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, start = int(rng.integers(20, 200)), int(rng.integers(0, 4000))
        tokens = (start + np.arange(n)) % 4000 + 1
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def overrides(corpus: Path) -> list[str]:
    """The tiny run: 4 steps, synchronous checkpoints at steps 2 and 4."""
    return [
        f"train.train_iters={ITERS}", "train.eval_interval=0", "train.warmup_iters=1",
        f"data.prefixes=[{corpus}]", f"data.cache_dir={corpus.parent / 'cache'}",
        "checkpoint.interval=2", "checkpoint.async_save=false",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory with two valid checkpoints (steps 2 and 4)."""
    import torch

    from llmctl.config import compose
    from llmctl.run.rundir import create_run_dir
    from llmctl.train import run_in_process

    base = tmp_path_factory.mktemp("reentry")
    corpus = _corpus(base / "corpus")
    cfg = compose("tiny_cpu", [*overrides(corpus), f"train.run_dir={base / 'run'}"])
    run_dir = create_run_dir(cfg, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_in_process(cfg, run_dir)
    finally:
        torch.set_num_threads(threads)
    assert store.committed_steps(run_dir / "checkpoints") == [2, 4]
    return run_dir


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run directory."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _flip_a_byte(ckpt: Path) -> None:
    shard = next(ckpt.glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x55  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _one_line_error(rc: int, out: str, err: str) -> str:
    assert rc == 2, out + err
    assert not out.strip(), out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_resume_refuses_when_every_checkpoint_is_invalid(run: Path, llmctl) -> None:
    for step in (2, 4):
        _flip_a_byte(run / "checkpoints" / store.iter_name(step))
    before = _snapshot(run)
    line = _one_line_error(*llmctl("resume", str(run), "--dry-run"))
    assert "iter_0000004: __0_" in line and "iter_0000002: __0_" in line
    assert line.count("checksum mismatch") == 2 and "--restart-from-scratch" in line
    assert _snapshot(run) == before  # refused: nothing moved, nothing rewritten

    res = runner.invoke(app, ["resume", str(run), "--restart-from-scratch", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    resume = json.loads(res.output)["resume"]
    assert resume["from_step"] is None
    assert [Path(v["path"]).name for v in resume["invalid"]] == ["iter_0000004", "iter_0000002"]
    assert _snapshot(run) == before  # a dry run moves nothing either


def test_invalid_checkpoints_are_moved_aside_on_launch(run: Path) -> None:
    from llmctl.launch.ckpt_resume import prepare_resume
    from llmctl.launch.reentry import accept_run_dir

    _flip_a_byte(run / "checkpoints" / store.iter_name(4))
    launch = prepare_resume(run, [])
    assert launch.resume_point.step == 2  # the ranks load step 2, as they would
    moved = accept_run_dir(launch.resume_point)
    invalid = run / "checkpoints" / store.INVALID_DIR
    assert moved == [invalid / "iter_0000004"]
    assert "checksum mismatch" in (invalid / "iter_0000004.reason.txt").read_text()
    assert store.committed_steps(run / "checkpoints") == [2]
    # retention and loading only see checkpoints/iter_N: the evidence outlives any policy
    assert store.apply_retention(run / "checkpoints", keep_last=1, keep_every=None) == []
    assert (invalid / "iter_0000004" / store.MANIFEST).is_file()


def test_a_replaced_same_step_checkpoint_is_kept(run: Path, tmp_path: Path) -> None:
    root = run / "checkpoints"
    tmp = store.staging_dir(root, 4)
    shutil.copytree(root / store.iter_name(4), tmp)
    manifest = json.loads((tmp / store.MANIFEST).read_text())
    store.commit(root, tmp, 4, manifest)
    assert (root / store.INVALID_DIR / "iter_0000004" / store.MANIFEST).is_file()


def test_resume_checks_overrides_against_the_checkpoint(run: Path, llmctl) -> None:
    before = _snapshot(run)
    line = _one_line_error(*llmctl("resume", str(run), "model.hidden_size=128", "--dry-run"))
    assert "model.hidden_size=64" in line and "128" in line
    assert _snapshot(run) == before


def test_train_into_a_run_dir_with_another_model_changes_nothing(run: Path, llmctl) -> None:
    before = _snapshot(run)
    line = _one_line_error(
        *llmctl("train", "recipe=tiny_cpu", f"train.run_dir={run}", "model.num_layers=4")
    )
    assert "model.num_layers=2" in line and "4" in line
    assert _snapshot(run) == before  # config.yaml not rewritten, no launch.json


def test_a_run_past_train_iters_is_refused_before_any_rank_starts(run: Path, llmctl) -> None:
    """Re-entering with fewer train_iters than the checkpoint's step: one line, nothing
    changed (config.yaml keeps its train_iters, so `status` never reads "step 4/3")."""
    before = _snapshot(run)
    train = ("train", "recipe=tiny_cpu", f"train.run_dir={run}", "train.train_iters=3")
    for argv in (train, ("resume", str(run), "train.train_iters=3")):
        line = _one_line_error(*llmctl(*argv))
        assert "checkpoint is at step 4, already past train.train_iters=3" in line, line
        assert "nothing to train" in line
        assert _snapshot(run) == before
    from llmctl.launch.jobs import total_steps  # what `status` shows as the step total

    assert total_steps(run) == ITERS


def test_train_refuses_a_directory_it_did_not_make(tmp_path: Path, llmctl) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me\n")
    line = _one_line_error(*llmctl("train", "recipe=tiny_cpu", f"train.run_dir={mine}"))
    assert "is not a run directory" in line
    assert [p.name for p in mine.iterdir()] == ["todo.txt"]


def test_run_dir_that_is_a_file_or_under_one_is_refused_and_kept(tmp_path: Path, llmctl) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    for dry in ((), ("--dry-run",)):
        line = _one_line_error(*llmctl("train", "recipe=tiny_cpu", f"train.run_dir={notes}", *dry))
        assert line == (
            f"error: train.run_dir={notes} is a file, not a directory; choose a new or empty "
            "directory"
        )
        line = _one_line_error(
            *llmctl("train", "recipe=tiny_cpu", f"train.run_dir={notes / 'run'}", *dry)
        )
        assert line.startswith(f"error: train.run_dir={notes / 'run'}: cannot write ")
        assert line.endswith(f"{notes} is a file, not a folder")
    assert notes.read_text() == "keep me\n" and [p.name for p in tmp_path.iterdir()] == [
        "notes.txt"
    ]


def test_dry_run_says_whether_the_run_dir_exists(run: Path, tmp_path: Path, llmctl) -> None:
    rc, out, _ = llmctl("resume", str(run), "--dry-run")
    assert rc == 0 and out.startswith(f"dry run: launcher=local, run dir {run} (left as it is)")
    new = tmp_path / "new"
    rc, out, _ = llmctl("train", "recipe=tiny_cpu", f"train.run_dir={new}", "--dry-run")
    assert rc == 0 and out.startswith(f"dry run: launcher=local, run dir {new} (not created)")
    assert not new.exists()


def test_resume_takes_layout_flags_and_cluster_file(run: Path, tmp_path: Path) -> None:
    import yaml

    cluster = yaml.safe_load((run / "config.yaml").read_text())["cluster"]
    cluster["name"] = "renamed_cpu_box"
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    res = runner.invoke(
        app, ["resume", str(run), "--dp", "2", "--cluster-file", str(tmp_path / "cluster.yaml"),
              "--dry-run", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["world_size"] == 2 and out["resume"]["from_step"] == 4
    assert "name: renamed_cpu_box" in out["config"]


def test_resume_takes_a_group_option_over_the_saved_section(run: Path, llmctl) -> None:
    before = _snapshot(run)
    rc, out, err = llmctl("resume", str(run), "launcher=slurm", "--dry-run", "--json")
    assert rc == 0, err
    described = json.loads(out)
    assert described["kind"] == "slurm" and "#SBATCH" in described["sbatch"]
    assert "kind: slurm" in described["config"]
    line = _one_line_error(*llmctl("resume", str(run), "recipe=tiny_cpu", "--dry-run"))
    assert line == "error: resume cannot change recipe"
    assert _snapshot(run) == before


def test_not_a_run_directory_is_worded_one_way(tmp_path: Path, llmctl) -> None:
    from llmctl.run.rundir import require_run_dir

    line = _one_line_error(*llmctl("resume", str(tmp_path), "--dry-run"))
    with pytest.raises(Exception, match="not a run directory") as err:
        require_run_dir(tmp_path)
    assert str(tmp_path) in line and err.value.message in line  # type: ignore[attr-defined]


def test_resume_applies_overrides_and_keeps_what_it_must(run: Path, tmp_path: Path) -> None:
    from llmctl.errors import UserError
    from llmctl.launch.ckpt_resume import prepare_resume

    res = runner.invoke(app, ["resume", str(run), "train.train_iters=40", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["run_dir"] == str(run.resolve()) and out["resume"] == {"from_step": 4, "invalid": []}
    assert "train_iters: 40" in out["config"] and "recipe: tiny_cpu" in out["config"]
    with pytest.raises(UserError, match=r"cannot change train\.run_dir"):
        prepare_resume(run, ["train.run_dir=/elsewhere"])
    with pytest.raises(UserError, match=r"cannot change checkpoint\.load"):
        prepare_resume(run, ["checkpoint.load=false"])
    for step in (2, 4):
        shutil.rmtree(run / "checkpoints" / store.iter_name(step))
    with pytest.raises(UserError, match="has no checkpoint to resume from"):
        prepare_resume(run, [])
    assert prepare_resume(run, [], restart_from_scratch=True).resume_point.step is None


def test_ranks_never_start_over_silently(run: Path) -> None:
    """The ranks' own check (a SLURM requeue or torchrun restart skips `llmctl resume`)."""
    import torch

    from llmctl.config import load_resolved
    from llmctl.errors import UserError
    from llmctl.train import run_in_process

    for step in (2, 4):
        _flip_a_byte(run / "checkpoints" / store.iter_name(step))
    cfg = load_resolved(run / "config.yaml")
    cfg.train.run_dir = str(run)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(UserError, match=r"no valid checkpoint in .*--restart-from-scratch"):
            run_in_process(cfg, run)
    finally:
        torch.set_num_threads(threads)
    assert store.committed_steps(run / "checkpoints") == [2, 4]  # evidence untouched
