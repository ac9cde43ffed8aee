"""Entry point of every training process: `python -m llmctl.train.entry RUN_DIR`.

Runs under torchrun (any number of ranks) or as one plain process. Reads RUN_DIR/config.yaml
and RUN_DIR/plan.json, trains, writes RUN_DIR/metrics.jsonl, RUN_DIR/logs/rank<N>.log and
RUN_DIR/perf.json, and exits 0 (2 on a user error; a checkpointer that stops the run, e.g. on
preemption, exits with its own code). The `__main__` guard matters: checkpoint writers start a
`spawn` multiprocessing Manager, which re-imports this module.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path


def _setup_logging(run_dir: Path, rank: int) -> None:
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    file_handler = logging.FileHandler(logs / f"rank{rank}.log")
    file_handler.setFormatter(fmt)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(file_handler)
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
    _setup_logging(run_dir, int(os.environ.get("RANK", "0")))

    from llmctl.config import load_resolved
    from llmctl.errors import UserError
    from llmctl.train import parallel
    from llmctl.train.run import train
    from llmctl.train.rundir import CONFIG_FILE, read_plan

    try:
        cfg = load_resolved(run_dir / CONFIG_FILE)
        plan = read_plan(run_dir)
        parallel.init_distributed()
        from llmctl.train.checkpoint import make_checkpointer

        train(cfg, run_dir, plan=plan, checkpointer=make_checkpointer(cfg, run_dir, plan))
    except UserError as e:
        logging.getLogger("llmctl.train").error("Error: %s", e.message)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
