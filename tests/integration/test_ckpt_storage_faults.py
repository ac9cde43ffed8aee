"""Storage faults under the real local launcher: the run directory on a small real filesystem.

The run directory lives on a tmpfs of a few MiB mounted for the test (root only). Once the first
checkpoint is committed the filesystem is filled to the last byte (ENOSPC). The oracle is the
kernel's own error on a real filesystem: no mock. The run must go through the failed-save
policy (two failed saves, then stop), `llmctl train` must exit 3 with one line naming the cause
(no traceback from the rank or from the launcher's own log copy), launch.json must record the
exit code, no `.tmp-iter_*` may be left, the committed checkpoint must still validate, and no
process of the run may be left.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from ckpt_support import base_overrides, make_corpus
from run_procs import (
    assert_no_process_left,
    kill_marked,
    launch_record,
    new_mark,
    start_cli,
    wait_until,
)

from llmctl.train import ckpt_store as store

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


def _fill(mnt: Path) -> None:
    """Write until the filesystem refuses (ENOSPC), in ever smaller pieces, to the last byte."""
    with open(mnt / "filler", "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break


# (iters, interval, max_failed_saves, the line the user gets): the policy stop mid-run, and a
# run whose final save fails (it must not end "finished" with its last steps in no checkpoint).
CASES = {
    "policy_stop": (400, 2, 2, "stopping: 2 consecutive checkpoint saves failed"),
    "final_save": (12, 2, 9, "the final checkpoint (step 12) failed"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_full_disk_goes_through_failed_save_policy(
    case: str, small_fs: Path, tmp_path: Path
) -> None:
    iters, interval, max_failed, line = CASES[case]
    corpus = make_corpus(tmp_path / "data" / "corpus")  # off the small filesystem
    run_dir = small_fs / "run"
    mark, log = new_mark(), tmp_path / "cli.log"
    args = ["train", "recipe=tiny_cpu", "launcher=local", f"train.run_dir={run_dir}",
            *base_overrides(corpus, iters), f"checkpoint.interval={interval}",
            "checkpoint.keep_last=10", "checkpoint.save_retries=0",
            f"checkpoint.max_failed_saves={max_failed}"]  # fmt: skip
    proc = start_cli(args, mark, log)
    try:
        wait_until(lambda: (store.read_latest(run_dir / "checkpoints") or 0) >= 2, 240, "iter 2")
        _fill(small_fs)
        rc = proc.wait(timeout=240)
    finally:
        kill_marked(mark)
    out = log.read_text()
    assert rc == 3, out[-3000:]
    # No traceback from the rank or from the launcher's log copy (torchrun's own ChildFailedError
    # summary still prints; the line after it is ours).
    assert "[rank0]: Traceback" not in out and "Process ForkProcess" not in out, out[-3000:]
    assert "llmctl/launch/" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"run failed (exit 3): {line}"), last
    kept = store.list_checkpoints(run_dir / "checkpoints", full=True)
    assert kept and all(v.ok for v in kept), kept  # what was committed before the fault stays
    assert f"newest complete checkpoint is step {kept[0].step}" in last, last
    assert launch_record(run_dir)["exit_code"] == 3  # written into the room it reserved
    assert_no_process_left(mark, 10)
    names = os.listdir(run_dir / "checkpoints")
    assert not [n for n in names if n.startswith(store.TMP_PREFIX)], names
    assert kept[0].step < (iters if case == "final_save" else 400)
