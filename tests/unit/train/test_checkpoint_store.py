"""Checkpoint directory protocol without torch: commit, latest pointer, retention, validation."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from llmctl.run import ckpt_store as store


def _fake_checkpoint(root: Path, step: int, world_size: int = 1) -> Path:
    """A committed checkpoint with the files validation requires (content is arbitrary)."""
    tmp = store.staging_dir(root, step)
    (tmp / store.RNG_DIR).mkdir(parents=True)
    for rank in range(world_size):
        (tmp / f"__{rank}_0.distcp").write_bytes(bytes(range(256)) * (step + 1))
        (tmp / store.RNG_DIR / f"rank_{rank}.json").write_text("{}")
        store.write_rank_marker(tmp, rank, store.rank_files(tmp, rank))
    (tmp / "metadata.json").write_text("{}")
    (tmp / store.TRAIN_STATE).write_text(json.dumps({"step": step}))
    (tmp / ".metadata").write_bytes(b"x")
    manifest = store.build_manifest(tmp, world_size, {"step": step, "world_size": world_size})
    return store.commit(root, tmp, step, manifest)


def test_commit_writes_manifest_and_latest(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path, 10, world_size=2)
    assert path.name == "iter_0000010"
    assert store.read_latest(tmp_path) == 10
    manifest = json.loads((path / store.MANIFEST).read_text())
    assert set(manifest["files"]) >= {"__0_0.distcp", "__1_0.distcp", "rng/rank_1.json"}
    assert not list(path.glob(".rank-*.json")), "markers are merged into the manifest"
    assert store.validate(path, full=False).ok


def test_missing_rank_marker_refuses_commit(tmp_path: Path) -> None:
    tmp = tmp_path / ".tmp-iter_0000001"
    tmp.mkdir()
    store.write_rank_marker(tmp, 0, [])
    with pytest.raises(RuntimeError, match="rank 1 did not finish"):
        store.build_manifest(tmp, 2, {"step": 1})


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: (p / "__0_0.distcp").unlink(), "missing file __0_0.distcp"),
        (lambda p: (p / store.MANIFEST).unlink(), "manifest.json missing"),
        (lambda p: (p / store.MANIFEST).write_text("{not json"), "manifest.json unreadable"),
        (lambda p: (p / "__0_0.distcp").write_bytes(b"short"), "size 5"),
    ],
)
def test_validation_detects_damage(tmp_path: Path, damage, reason: str) -> None:
    path = _fake_checkpoint(tmp_path, 3)
    damage(path)
    result = store.validate(path, full=False)
    assert not result.ok
    assert reason in result.reason


def test_checksum_mismatch_only_in_full_mode(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path, 3)
    data = bytearray((path / "__0_0.distcp").read_bytes())
    data[7] ^= 0xFF  # same size, one bit pattern changed
    (path / "__0_0.distcp").write_bytes(bytes(data))
    assert store.validate(path, full=False).ok
    full = store.validate(path, full=True)
    assert not full.ok and "checksum mismatch" in full.reason


def test_newest_valid_skips_broken(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step)
    (tmp_path / "iter_0000003" / store.MANIFEST).unlink()
    valid, skipped = store.newest_valid(tmp_path, full=False)
    assert valid is not None and valid.step == 2
    assert [v.step for v in skipped] == [3]


def test_retention_keeps_last_and_milestones() -> None:
    steps = [10, 20, 30, 40, 50, 60]
    assert store.retention_victims(steps, keep_last=2, keep_every=None) == [10, 20, 30, 40]
    assert store.retention_victims(steps, keep_last=2, keep_every=20) == [10, 30]


def test_apply_retention_and_clean_stale(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step)
    (tmp_path / ".tmp-iter_0000004").mkdir()
    (tmp_path / ".del-iter_0000000-1").mkdir()
    assert store.apply_retention(tmp_path, keep_last=1, keep_every=None) == [1, 2]
    assert sorted(store.clean_stale(tmp_path)) == [".del-iter_0000000-1", ".tmp-iter_0000004"]
    assert store.committed_steps(tmp_path) == [3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000003", "latest"]


def test_restricted_unpickler_rejects_code(tmp_path: Path) -> None:
    from llmctl.run.ckpt_safe import UnsafePickleError, load_metadata

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    bad = tmp_path / ".metadata"
    bad.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(UnsafePickleError, match=r"builtins\.print"):
        load_metadata(bad)


def test_checksum_work_is_split_between_ranks(tmp_path: Path) -> None:
    path = _fake_checkpoint(tmp_path, 3, world_size=2)
    files = sorted(json.loads((path / store.MANIFEST).read_text())["files"])
    victim = files.index("__1_0.distcp")
    data = bytearray((path / "__1_0.distcp").read_bytes())
    data[0] ^= 0xFF
    (path / "__1_0.distcp").write_bytes(bytes(data))
    owner, other = (victim % 2, 2), (1 - victim % 2, 2)
    assert "checksum mismatch" in store.validate(path, crc_part=owner).reason
    assert not any("checksum" in p for p in store.validate(path, crc_part=other).problems)
