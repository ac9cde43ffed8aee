"""`llmctl train`: compose, check the plan, resolve the layout, render; then execute.

`prepare_train` is pure apart from reading files (recipes, hostfile): it composes the config,
asks the planner whether the layout fits (refusing a predicted misfit with the numbers unless
forced), resolves the layout and renders the launcher's commands. `--dry-run` prints that and
stops. `execute_train` checks the launcher's requirements (sbatch on PATH, hosts reachable),
runs the training preflight (data, precision), creates the run directory and starts the run.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.common import check_launcher_values
from llmctl.launch.hostfile import read_hostfile

if TYPE_CHECKING:
    from llmctl.plan import Layout, PlanRecord, Sharding

LAUNCH_FILE = "launch.json"


@dataclass(kw_only=True)
class TrainLaunch:
    """Everything `llmctl train` decided before running anything."""

    cfg: Any
    kind: str
    run_dir: Path
    layout: Layout
    plan: PlanRecord
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    nodes: list[Any] = field(default_factory=list)
    sbatch: str = ""
    resume_point: Any = None  # launch.reentry.ResumePoint for an existing run directory

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary: what would run (the --dry-run/--json view)."""
        from llmctl.run.layout import layout_record

        out: dict[str, Any] = {
            "kind": self.kind,
            "run_dir": str(self.run_dir),
            "layout": layout_record(self.layout, self.cfg.train.global_batch_size),
            "world_size": self.layout.world_size,
            "plan": self.plan.as_dict(),
        }
        if self.resume_point is not None:
            out["resume"] = self.resume_point.as_dict()
        if self.kind == "local":
            out["command"] = self.argv
            out["env"] = self.env
        elif self.kind == "torchrun":
            out["nodes"] = [
                {
                    "host": n.host,
                    "node_rank": n.node_rank,
                    "command": list(n.argv),
                    "env": n.env,
                    "secrets": list(n.secrets),
                    "ssh": list(n.ssh_argv),
                }
                for n in self.nodes
            ]
        else:
            out["sbatch"] = self.sbatch
        return out


def prepare_train(
    recipe: str,
    overrides: list[str],
    *,
    cluster_file: str | None = None,
    force: bool = False,
    restart_from_scratch: bool = False,
) -> TrainLaunch:
    """Compose, plan-check, resolve the layout and render the launch (starts nothing).

    Args:
        recipe: Recipe name or YAML path (a run's config.yaml for `resume`).
        overrides: Hydra overrides.
        cluster_file: Cluster description replacing the recipe's cluster.
        force: Launch even if the plan predicts the layout won't fit (`--ignore-fit`).
        restart_from_scratch: In an existing run directory whose checkpoints are all invalid,
            start over at step 1 instead of refusing.

    Raises:
        UserError: Bad config, a layout predicted not to fit (unless forced), a layout the
            world size cannot hold, a malformed hostfile or launcher value, an existing run
            directory whose checkpoints are all invalid or do not match the config.
    """
    from llmctl.config import compose
    from llmctl.launch.reentry import inspect_run_dir
    from llmctl.launch.slurm import requeue_checkpoint_default
    from llmctl.run.layout import resolve_layout
    from llmctl.run.lock import check_run_lock
    from llmctl.run.rundir import absolute_paths, default_run_dir

    cfg = compose(recipe, overrides, cluster_file=cluster_file)
    cfg.train.force = bool(force or cfg.train.force)
    absolute_paths(cfg)
    requeue_checkpoint_default(cfg)
    _early_checks(cfg)
    plan = plan_check(cfg, force=cfg.train.force)
    layout = resolve_layout(cfg, None, plan.layout)
    run_dir = Path(cfg.train.run_dir or default_run_dir(cfg.recipe)).resolve()
    cfg.train.run_dir = str(run_dir)
    launch = TrainLaunch(
        cfg=cfg, kind=str(cfg.launcher.kind), run_dir=run_dir, layout=layout, plan=plan
    )
    check_run_lock(run_dir)  # a live trainer's run directory is not even read
    launch.resume_point = inspect_run_dir(cfg, layout, restart_from_scratch=restart_from_scratch)
    if launch.resume_point is None or launch.resume_point.step is None:  # step 0: init_from
        from llmctl.hf.init import check_init_from

        check_init_from(cfg, layout.tp)  # the ranks' model check, before any rank starts
    _render(launch)
    return launch


def _early_checks(cfg: Any) -> None:
    """Precision and explicit data, checked before planning so dry runs report them too.

    The demo corpus (empty data.prefixes) is only built at launch: a dry run writes nothing.
    """
    from llmctl.run.data import check_sft_wanted, resolve_data
    from llmctl.run.precision import check_precision

    check_launcher_values(cfg)
    on_gpu = str(cfg.cluster.device) == "cuda"
    check_precision(cfg.precision, has_cuda=on_gpu, has_te=on_gpu)
    check_sft_wanted(cfg)
    if cfg.data.prefixes:
        resolve_data(cfg)


def _render(launch: TrainLaunch) -> None:
    cfg, run_dir, layout = launch.cfg, launch.run_dir, launch.layout
    if launch.kind == "local":
        from llmctl.launch.local import render_local, render_local_env

        launch.argv = render_local(cfg, run_dir, layout)
        launch.env = render_local_env(cfg, layout)
    elif launch.kind == "torchrun":
        from llmctl.launch.torchrun import render_torchrun_nodes

        if not cfg.launcher.hostfile:
            raise UserError("launcher=torchrun needs launcher.hostfile=PATH (one host per line)")
        hosts = read_hostfile(cfg.launcher.hostfile)
        launch.nodes = render_torchrun_nodes(cfg, run_dir, hosts, layout)
    elif launch.kind == "slurm":
        from llmctl.launch.slurm import render_sbatch

        launch.sbatch = render_sbatch(cfg, run_dir, layout)
    else:  # the schema's enum makes this unreachable from a composed config
        raise UserError(f"unknown launcher.kind {launch.kind!r}: use local, torchrun or slurm")


def plan_check(cfg: Any, *, force: bool) -> PlanRecord:
    """Plan the configured layout; refuse a predicted misfit unless forced.

    Only optimizer shardings the runner implements are searched (`layout.runner_shardings`).
    On CPU clusters ranks are processes, so `cluster.gpus_per_node` follows the ranks the run
    asks for before planning (`layout.cpu_ranks_follow_layout`).

    Returns:
        The plan recorded in plan.json: the chosen layout and its predictions.

    Raises:
        UserError: The layout is predicted not to fit and `force` is False (the message carries
            the predicted peak and the usable memory), the layout is impossible, or it asks for
            a sharding the runner does not implement.
    """
    from llmctl.plan import PlanRecord
    from llmctl.run.layout import cpu_ranks_follow_layout, runner_shardings
    from llmctl.run.planning import plan_config

    cpu_ranks_follow_layout(cfg)
    results = [plan_config(_with_sharding(cfg, s)) for s in runner_shardings(cfg)]
    fitting = [(r, r.best) for r in results if r.best is not None]
    if fitting:
        result, best = min(fitting, key=lambda pair: pair[1].time.total_s)
        return PlanRecord.of(result, best)
    near = [(r, r.closest) for r in results if r.closest is not None]
    if not near:
        raise UserError("the planner found no valid layout: " + "; ".join(results[0].suggestions))
    result, closest = min(near, key=lambda pair: pair[1].memory.total_gib)
    if not force:
        hint = f" ({result.suggestions[0]})" if result.suggestions else ""
        raise UserError(
            f"layout {closest.layout.short()} needs {closest.memory.total_gib:.3g} GiB per "
            f"device but {result.usable_gib:.3g} GiB are usable on {cfg.cluster.name}{hint}; "
            "change the layout (see `llmctl plan`) or pass --ignore-fit"
        )
    return PlanRecord.of(result, closest)


def _with_sharding(cfg: Any, sharding: Sharding) -> Any:
    out = copy.deepcopy(cfg)
    out.parallel.optimizer_sharding = sharding
    return out


def check_launcher(launch: TrainLaunch) -> None:
    """Launcher requirements, checked before the run directory or any process exists.

    Raises:
        UserError: sbatch missing, an unreachable or misconfigured host, an unset secret.
    """
    if launch.kind == "slurm":
        from llmctl.launch.slurm import check_slurm

        check_slurm(launch.cfg)
    elif launch.kind == "torchrun":
        from llmctl.launch.torchrun import check_hosts, secret_values

        secret_values(tuple(launch.cfg.launcher.secrets))
        check_hosts(launch.cfg, launch.nodes)


def execute_train(launch: TrainLaunch, echo: TextIO | None = None) -> dict[str, Any]:
    """Check requirements, create the run directory, and run (local, ssh) or submit (SLURM).

    Args:
        launch: What `prepare_train` decided.
        echo: Where the run's console output is copied (default stdout).

    Returns:
        {"kind", "run_dir", and "exit_code" (local/torchrun) or "job_id" (slurm)}.
    """
    from llmctl.run.preflight import preflight

    check_launcher(launch)
    preflight(launch.cfg, launch.layout.world_size, launch.plan.layout)
    lock = _lock_run_dir(launch)  # one trainer per run directory; before anything is written
    try:
        return _execute_locked(launch, echo, lock)
    finally:
        if lock is not None:
            lock.release()


def _lock_run_dir(launch: TrainLaunch) -> Any:
    """Hold the run directory for the local launcher; only check it for jobs that lock it
    themselves (SLURM, ssh: rank 0 takes the lock). Raises UserError if another trainer has it."""
    from llmctl.run.lock import acquire_run_lock, check_run_lock

    if launch.kind == "local":
        return acquire_run_lock(launch.run_dir)
    check_run_lock(launch.run_dir)
    return None


def _execute_locked(launch: TrainLaunch, echo: TextIO | None, lock: Any) -> dict[str, Any]:
    from llmctl.launch.reentry import accept_run_dir
    from llmctl.run.rundir import create_run_dir

    accept_run_dir(launch.resume_point)  # the launch is accepted: invalid checkpoints aside
    create_run_dir(launch.cfg, launch.plan)
    shown = {k: v for k, v in launch.describe().items() if k in ("command", "nodes")}
    record = {"kind": launch.kind, "run_dir": str(launch.run_dir), "started": time.time()}
    record.update(pid=os.getpid(), host=socket.gethostname(), **shown)
    result: dict[str, Any] = {"kind": launch.kind, "run_dir": str(launch.run_dir)}
    if launch.kind == "slurm":
        from llmctl.launch.slurm import execute_slurm

        result["job_id"] = record["job_id"] = execute_slurm(launch.sbatch, launch.run_dir)
        write_launch(launch.run_dir, record)
        return result
    write_launch(launch.run_dir, record)
    from llmctl.launch.common import RankExits

    exits = RankExits()
    if launch.kind == "local":
        from llmctl.launch.local import execute_local

        log = launch.run_dir / "logs" / "launcher.log"
        rc = execute_local(launch.argv, launch.env, log, echo, lock_fd=lock.fd, exits=exits)
    else:
        from llmctl.launch.torchrun import execute_torchrun

        rc = execute_torchrun(launch.nodes, launch.run_dir / "logs", echo, exits=exits)
    record.update(exit_code=rc, finished=time.time())
    if exits.reason():
        record["reason"] = result["reason"] = exits.reason()
    write_launch(launch.run_dir, record)
    result["exit_code"] = rc
    return result


_LAUNCH_RESERVE = 2048  # trailing spaces: room for the final record on a disk that fills up


def write_launch(run_dir: Path, record: dict[str, Any]) -> None:
    """Replace launch.json atomically, with room reserved for the final record.

    On a full disk the atomic replace fails; the final record (exit code) then overwrites the
    file in place, inside the space the first record reserved (JSON allows trailing blanks).
    """
    path = run_dir / LAUNCH_FILE
    text = json.dumps(record, indent=2) + "\n"
    tmp = path.with_name(f".{LAUNCH_FILE}.tmp")
    try:
        tmp.write_text(text + " " * _LAUNCH_RESERVE)
        os.replace(tmp, path)
        return
    except OSError as e:
        tmp.unlink(missing_ok=True)
        error = e
    data = text.encode()
    try:
        if path.is_file() and path.stat().st_size >= len(data):
            with path.open("r+b") as f:
                f.write(data + b" " * (path.stat().st_size - len(data)))
            return
    except OSError as e:
        error = e
    print(f"llmctl: cannot write {path} ({error.strerror})", file=sys.stderr, flush=True)


def read_launch(run_dir: str | Path) -> dict[str, Any]:
    """The launch record of a run directory ({} when there is none)."""
    path = Path(run_dir) / LAUNCH_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text() or "{}")
    return data if isinstance(data, dict) else {}
