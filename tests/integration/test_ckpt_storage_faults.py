"""Storage faults under the real local launcher: real filesystems failing during a run.

Once the first checkpoint is committed the storage fails for real (root only; the oracle is the
kernel's own error, no mock):
- ENOSPC: the run directory on a tmpfs of a few MiB, filled to the last byte;
- EROFS: the run's `checkpoints/` made a read-only bind mount while training goes on;
- EIO: the run directory on ext4 over a loop device, shut down with EXT4_IOC_SHUTDOWN (what ext4
  does after an I/O error it cannot survive: every later operation fails with EIO).
The run must go through the failed-save policy (two failed saves, then stop), `llmctl train`
must exit 3 with one line naming the cause (no traceback from the rank or from the launcher's
own log copy), what was committed before the fault must still validate, nothing half-written
may look complete, and no process of the run may be left. ENOSPC and EROFS leave room to record
the exit code in launch.json; after EIO nothing on that filesystem can be written.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from ckpt_support import base_overrides, make_corpus
from fs_faults import fill
from run_procs import (
    assert_no_process_left,
    kill_marked,
    launch_record,
    new_mark,
    start_cli,
    wait_until,
)

from llmctl.run import ckpt_store as store
from llmctl.run.storage_posix import TMP_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]
SIZE_MIB = 40  # a checkpoint of the tiny model is ~8 MiB


@pytest.fixture
def small_fs(tmp_path: Path):
    """A freshly mounted tmpfs of SIZE_MIB MiB; unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    opts = f"size={SIZE_MIB}m"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], check=False)
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def ext4_fs(tmp_path: Path):
    """A fresh 64 MiB ext4 on a loop device (autoclear); unmounted afterwards."""
    if os.geteuid() != 0 or not (shutil.which("mkfs.ext4") and shutil.which("mount")):
        pytest.skip("needs root, mkfs.ext4 and mount(8) for an ext4 on a loop device")
    image, mnt = tmp_path / "ext4.img", tmp_path / "ext4"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    if subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=False).returncode:
        pytest.skip("cannot mount an ext4 image on a loop device here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # as a failing disk does: the journal is not flushed


def _shut_down(mnt: Path) -> None:
    """Shut the ext4 filesystem down: from now on every operation on it fails with EIO."""
    fd = os.open(mnt, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
    finally:
        os.close(fd)


def _read_only(path: Path) -> None:
    """Make `path` a read-only bind mount of itself (EROFS for writes through its path)."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    # The remount is refused ("mount point is busy") while a save holds a file open for writing
    # through the new mount; saves are short, so try again until one lands between two saves.
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"read-only remount of {path} kept failing: {done.stderr}")
        time.sleep(0.02)


# (iters, max_failed_saves, the line the user gets; a save every 2 steps): the policy stop
# mid-run, and a run whose final save fails (it must not end "finished" with its last steps in
# no checkpoint).
CASES = {
    "policy_stop": (400, 2, "stopping: 2 consecutive checkpoint saves failed"),
    "final_save": (12, 9, "the final checkpoint (step 12) failed"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_full_disk_goes_through_failed_save_policy(
    case: str, small_fs: Path, tmp_path: Path
) -> None:
    iters, max_failed, line = CASES[case]
    corpus = make_corpus(tmp_path / "data" / "corpus")  # off the small filesystem
    run_dir = small_fs / "run"
    _, out = _train_into_fault(
        run_dir, corpus, tmp_path / "cli.log", lambda: fill(small_fs), iters, max_failed, line
    )
    kept = store.list_checkpoints(run_dir / "checkpoints", full=True)
    assert kept and all(v.ok for v in kept), kept  # what was committed before the fault stays
    last = out.strip().splitlines()[-1]
    assert f"newest complete checkpoint is step {kept[0].step}" in last, last
    assert launch_record(run_dir)["exit_code"] == 3  # written into the room it reserved
    names = os.listdir(run_dir / "checkpoints")
    assert not [n for n in names if n.startswith(TMP_PREFIX)], names
    assert kept[0].step < (iters if case == "final_save" else 400)


def _train_into_fault(
    run_dir: Path,
    corpus: Path,
    log: Path,
    fault,
    iters: int = 400,
    max_failed: int = 2,
    line: str = "stopping: 2 consecutive checkpoint saves failed",
) -> tuple[int, str]:
    """Train until iter 2 is committed, then `fault()`; the run should stop with exit code 3
    and `line` as the last line's cause (after `max_failed` failed saves, or a failed final
    save), with no traceback from the rank or from the launcher's log copy.

    Returns:
        llmctl train's exit code and its output.
    """
    mark = new_mark()
    args = ["train", "recipe=tiny_cpu", "launcher=local", f"train.run_dir={run_dir}",
            *base_overrides(corpus, iters), "checkpoint.interval=2", "checkpoint.keep_last=10",
            "checkpoint.save_retries=0", f"checkpoint.max_failed_saves={max_failed}"]  # fmt: skip
    proc = start_cli(args, mark, log)
    try:
        wait_until(lambda: (store.read_latest(run_dir / "checkpoints") or 0) >= 2, 240, "iter 2")
        fault()
        rc = proc.wait(timeout=240)
        assert_no_process_left(mark, 10)  # before the cleanup below kills what is left
    finally:
        kill_marked(mark)
    out = log.read_text()
    assert rc == 3, out[-3000:]
    # torchrun's own ChildFailedError summary still prints; the line after it is ours.
    assert "[rank0]: Traceback" not in out and "Process ForkProcess" not in out, out[-3000:]
    assert "llmctl/launch/" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"run failed (exit 3): {line}"), last
    return rc, out


def _assert_committed_intact(ckpt_root: Path) -> None:
    """What was committed before the fault validates; nothing half-written looks complete."""
    kept = store.list_checkpoints(ckpt_root, full=True)
    assert kept and all(v.ok for v in kept), [(v.path.name, v.reason) for v in kept]
    iters = [n for n in os.listdir(ckpt_root) if n.startswith("iter_")]
    assert sorted(iters) == sorted(v.path.name for v in kept), iters  # every iter_* is valid
    assert (store.read_latest(ckpt_root) or 0) <= kept[0].step


def test_read_only_checkpoints_go_through_failed_save_policy(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a read-only bind mount")
    corpus = make_corpus(tmp_path / "data" / "corpus")
    run_dir, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoints"
    try:
        _, out = _train_into_fault(run_dir, corpus, tmp_path / "cli.log", lambda: _read_only(ckpt))
        assert "Read-only file system" in out, out[-3000:]
        _assert_committed_intact(ckpt)
        assert launch_record(run_dir)["exit_code"] == 3
    finally:
        subprocess.run(["umount", str(ckpt)], check=False, capture_output=True)


def test_eio_goes_through_failed_save_policy(ext4_fs: Path, tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "data" / "corpus")  # off the failing filesystem
    run_dir = ext4_fs / "run"
    _, out = _train_into_fault(run_dir, corpus, tmp_path / "cli.log", lambda: _shut_down(ext4_fs))
    assert "Input/output error" in out, out[-3000:]
    # Mount it again (journal recovery, as after a reboot): the committed checkpoint is intact.
    subprocess.run(["umount", str(ext4_fs)], check=True)
    subprocess.run(["mount", "-o", "loop", str(tmp_path / "ext4.img"), str(ext4_fs)], check=True)
    _assert_committed_intact(run_dir / "checkpoints")
