"""Entry point of every training process: `python -m llmctl.train.entry RUN_DIR`.

Runs under torchrun (any number of ranks) or as one plain process. Reads RUN_DIR/config.yaml
and RUN_DIR/plan.json, trains, writes RUN_DIR/metrics.jsonl, RUN_DIR/logs/rank<N>.log and
RUN_DIR/perf.json, and exits 0 (2 on a user error; a checkpointer that stops the run, e.g. on
preemption, exits with its own code). A rank that exits non-zero says so in one line,
`llmctl: rank R exits C: why`: torchrun itself exits 1 whatever its workers' codes, so the
launcher reads the rank's code from that line (`llmctl.launch.common.EXIT_LINE_RE`).

The `__main__` guard matters: checkpoint writers start a `spawn` multiprocessing Manager, which
re-imports this module as `__mp_main__`; that Manager is made to die with its rank. A rank under
torchrun gets SIGTERM when torchrun dies (a checkpoint, then exit), so no rank outlives its
launcher.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

EXIT_LINE = "llmctl: rank {rank} exits {code}: {message}"


class _RankLogFile(logging.FileHandler):
    """rank<N>.log that a full or failing disk cannot turn into a traceback per record.

    The first failed write says so in one line on stderr; later records go to the other
    handlers only. What to do about the disk is the checkpointer's failed-save policy.
    """

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self.failed:
            self.failed = True
            print(f"llmctl: cannot write {self.baseFilename}; rank log stopped", file=sys.stderr)


def _setup_logging(run_dir: Path, rank: int) -> None:
    logs = run_dir / "logs"
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    try:
        logs.mkdir(parents=True, exist_ok=True)
        file_handler = _RankLogFile(logs / f"rank{rank}.log")
        file_handler.setFormatter(fmt)
        root.addHandler(file_handler)
    except OSError as e:
        print(f"llmctl: cannot open the rank log in {logs} ({e.strerror})", file=sys.stderr)
    if rank == 0:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger("llmctl").addHandler(console)
    if not os.environ.get("LLMCTL_VERBOSE"):  # `llmctl -v` keeps them on the console
        logging.captureWarnings(True)  # library warnings (megatron's "full scope is deprecated",
        # torch's ShardedTensor FutureWarning) go to rank<N>.log only, not to `llmctl logs`


def main(argv: list[str] | None = None) -> int:
    """Train the run in RUN_DIR on this rank. Returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m llmctl.train.entry RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: end with it
        from llmctl.run.signals import die_with_parent

        die_with_parent(signal.SIGTERM, os.getppid())
    from llmctl.errors import UserError
    from llmctl.run.lock import hold_for_rank

    try:
        locks = hold_for_rank(run_dir, rank)
    except UserError as e:  # before anything is written into a run dir another trainer owns
        return _exit_line(rank, 2, e.message)
    _setup_logging(run_dir, rank)
    try:
        return _run(run_dir, rank)
    finally:
        del locks


def _run(run_dir: Path, rank: int) -> int:
    from llmctl.config import load_resolved
    from llmctl.errors import UserError
    from llmctl.run.rundir import CONFIG_FILE, read_plan
    from llmctl.train import parallel
    from llmctl.train.run import train

    try:
        cfg = load_resolved(run_dir / CONFIG_FILE)
        plan = read_plan(run_dir)
        parallel.init_distributed()
        from llmctl.train.checkpoint import make_checkpointer

        train(cfg, run_dir, plan=plan, checkpointer=make_checkpointer(cfg, run_dir, plan))
    except UserError as e:
        logging.getLogger("llmctl.train").error("Error: %s", e.message)
        return _exit_line(rank, 2, e.message)
    except SystemExit as e:  # TrainingStopped: preemption, failed saves
        code = e.code if isinstance(e.code, int) else 1
        return _exit_line(rank, code, getattr(e, "message", "")) if code else 0
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _exit_line(rank: int, code: int, message: str) -> int:
    """Tell the launcher (through torchrun's output) this rank's exit code; returns it."""
    line = EXIT_LINE.format(rank=rank, code=code, message=" ".join(message.split()))
    print(line, file=sys.stderr, flush=True)
    return code


if __name__ == "__mp_main__":  # megatron's checkpoint Manager: never outlive the rank
    from llmctl.run.signals import die_with_parent

    die_with_parent(signal.SIGKILL)

if __name__ == "__main__":
    sys.exit(main())
