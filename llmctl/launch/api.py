"""`llmctl train`: compose, check the plan, resolve the layout, render; then execute.

`prepare_train` is pure apart from reading files (recipes, hostfile, data headers): it composes
the config, derives the launch's values into a resolved copy (`resolve_config`), asks the
planner whether the layout fits (refusing a predicted misfit with the numbers unless forced),
resolves the layout and has the backend of `launcher.kind` render its commands
(`launch.backend`). `--dry-run` prints that and stops. `execute_train` has the backend check
its requirements (sbatch on PATH, hosts reachable), runs the training preflight, creates the
run directory and hands the launch to the backend, which runs or submits it.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.backend import Backend, TrainLaunch, backend_for
from llmctl.launch.common import check_launcher_values

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.plan import PlanRecord, Sharding
    from llmctl.run.data import DataSpec
    from llmctl.run.lock import RunLock

LAUNCH_FILE = "launch.json"


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
    from llmctl.run.layout import resolve_layout
    from llmctl.run.lock import check_run_lock

    composed = compose(recipe, overrides, cluster_file=cluster_file)
    backend = backend_for(str(composed.launcher.kind))
    cfg = resolve_config(composed, backend, force=force)
    data = _early_checks(cfg, backend)
    plan = plan_check(cfg, force=cfg.train.force)
    layout = resolve_layout(cfg, None, plan.layout)
    run_dir = Path(str(cfg.train.run_dir))
    check_run_lock(run_dir)  # a live trainer's run directory is not even read
    point = inspect_run_dir(cfg, layout, restart_from_scratch=restart_from_scratch)
    if point is None or point.step is None:  # step 0: init_from
        from llmctl.hf.init import check_init_from

        check_init_from(cfg, layout.tp)  # the ranks' model check, before any rank starts
    return TrainLaunch(
        cfg=cfg,
        run_dir=run_dir,
        layout=layout,
        plan=plan,
        rendering=backend.render(cfg, run_dir, layout),
        resume_point=point,
        data=data,
    )


def resolve_config(cfg: RootConfig, backend: Backend, *, force: bool) -> RootConfig:
    """The composed config with what a launch derives from it (pure: `cfg` is left as it is).

    `train.force` (`--ignore-fit`), `train.run_dir` (absolute; default
    runs/<recipe>-<UTC timestamp>), absolute file paths (`rundir.absolute_paths`), the
    backend's defaults (SLURM: a checkpoint interval for requeueable jobs) and, on CPU
    clusters, `cluster.gpus_per_node` following the ranks the run asks for
    (`layout.with_cpu_ranks_for_layout`). This is the config the run directory records.
    """
    from llmctl.run.layout import with_cpu_ranks_for_layout
    from llmctl.run.rundir import absolute_paths, default_run_dir

    run_dir = Path(cfg.train.run_dir or default_run_dir(cfg.recipe)).resolve()
    train = replace(cfg.train, force=bool(force or cfg.train.force), run_dir=str(run_dir))
    out = backend.configure(absolute_paths(replace(cfg, train=train)))
    return with_cpu_ranks_for_layout(out)


def _early_checks(cfg: RootConfig, backend: Backend) -> DataSpec | None:
    """Launcher values, precision and explicit data, checked before planning so dry runs
    report them too. Returns the checked data (None: the demo corpus).

    This is the launch's one check of `data.prefixes`; the demo corpus (empty data.prefixes)
    is only built at launch (`preflight`): a dry run writes nothing.
    """
    from llmctl.run.data import check_sft_wanted, resolve_data
    from llmctl.run.precision import check_precision

    check_launcher_values(cfg, port_spread=backend.port_spread)
    on_gpu = str(cfg.cluster.device) == "cuda"
    check_precision(cfg.precision, has_cuda=on_gpu, has_te=on_gpu)
    if cfg.data.prefixes:
        return resolve_data(cfg)
    check_sft_wanted(cfg)
    return None


def plan_check(cfg: RootConfig, *, force: bool) -> PlanRecord:
    """Plan the configured layout; refuse a predicted misfit unless forced.

    Only optimizer shardings the runner implements are searched (`layout.runner_shardings`).
    On CPU clusters ranks are processes: `cfg` comes from `resolve_config`, whose
    `cluster.gpus_per_node` follows the ranks the run asks for.

    Returns:
        The plan recorded in plan.json: the chosen layout and its predictions.

    Raises:
        UserError: The layout is predicted not to fit and `force` is False (the message carries
            the predicted peak and the usable memory), the layout is impossible, or it asks for
            a sharding the runner does not implement.
    """
    from llmctl.plan import PlanRecord
    from llmctl.run.layout import runner_shardings
    from llmctl.run.planning import plan_config

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


def _with_sharding(cfg: RootConfig, sharding: Sharding) -> RootConfig:
    """`cfg` with the sharding fixed; FSDP is priced as the runner runs it (megatron-core's
    torch FSDP2 wrapper, `plan.fsdp=torch_fsdp2`), whatever `plan.fsdp` says."""
    from llmctl.plan.stack import FsdpImpl

    out = copy.deepcopy(cfg)
    out.parallel.optimizer_sharding = sharding
    if str(sharding) == "full":
        out.plan.fsdp = FsdpImpl.torch_fsdp2
    return out


def execute_train(launch: TrainLaunch, echo: TextIO | None = None) -> dict[str, Any]:
    """Check requirements, create the run directory, and run (local, ssh) or submit (SLURM).

    Args:
        launch: What `prepare_train` decided.
        echo: Where the run's console output is copied (default stdout).

    Returns:
        {"kind", "run_dir", and "exit_code" (a run that ran here) or "job_id" (a submitted job)}.
    """
    from llmctl.run.preflight import preflight

    backend = backend_for(launch.kind)
    backend.check(launch)  # launcher requirements: before the run directory or any process
    preflight(launch.cfg, launch.layout.world_size, launch.plan.layout, data=launch.data)
    lock = _lock_run_dir(launch, backend)  # one trainer per run directory; before any write
    try:
        return _execute_locked(launch, backend, echo, lock)
    finally:
        if lock is not None:
            lock.release()


def _lock_run_dir(launch: TrainLaunch, backend: Backend) -> RunLock | None:
    """Hold the run directory for a launcher that waits on its run (`Backend.holds_lock`);
    only check it for jobs whose rank 0 locks it. Raises UserError if another trainer has it."""
    from llmctl.run.lock import acquire_run_lock, check_run_lock

    if backend.holds_lock:
        return acquire_run_lock(launch.run_dir)
    check_run_lock(launch.run_dir)
    return None


def _execute_locked(
    launch: TrainLaunch, backend: Backend, echo: TextIO | None, lock: RunLock | None
) -> dict[str, Any]:
    from llmctl.launch.reentry import accept_run_dir
    from llmctl.run.rundir import create_run_dir

    accept_run_dir(launch.resume_point)  # the launch is accepted: invalid checkpoints aside
    create_run_dir(launch.cfg, launch.plan)
    record = {"kind": launch.kind, "run_dir": str(launch.run_dir), "started": time.time()}
    record.update(pid=os.getpid(), host=socket.gethostname(), **launch.rendering.recorded())

    def started(fields: dict[str, Any]) -> None:
        record.update(fields)
        write_launch(launch.run_dir, record)

    outcome = backend.execute(launch, echo=echo, lock=lock, started=started)
    result: dict[str, Any] = {"kind": launch.kind, "run_dir": str(launch.run_dir)}
    if outcome.job_id is not None:  # submitted: the job records its own end (launch.node)
        result["job_id"] = outcome.job_id
        return result
    record.update(exit_code=outcome.exit_code, finished=time.time())
    reason = exit_reason(launch.run_dir, outcome.exit_code, outcome.reason)
    if reason:
        record["reason"] = result["reason"] = reason
    write_launch(launch.run_dir, record)
    result["exit_code"] = outcome.exit_code
    return result


def exit_reason(run_dir: Path, exit_code: int | None, reported: str | None) -> str | None:
    """The one line explaining a run's end: for the hang code (`run.health.EXIT_HANG`) the
    watchdog's `rank R on HOST made no progress for Ns; stacks in RUN_DIR/hangs/...` from
    health.jsonl (the ranks' own report may be missing or name only the reporting rank),
    else what the ranks reported."""
    from llmctl.run.health import EXIT_HANG, last_hang_line

    if exit_code == EXIT_HANG:
        return last_hang_line(run_dir) or reported
    return reported


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
