"""Elastic re-plan (`launcher.elastic=true`): a lost host shrinks the run, a host back grows it.

ssh launcher (`launcher=torchrun`): the launcher supervises one ssh session per host, as without
elasticity, but restarts by re-planning instead of waiting for the same host. When a session
fails, every host of the layout is probed once over ssh (`torchrun.host_answers`); a host whose
session ended with ssh's 255 (its agent died, or the connection broke) or that does not answer
is *lost*. Then:

- the planner is asked for the best layout on the hosts left, through the same path as
  `llmctl resume RUN --nodes N` (`ckpt_resume.prepare_resume`, `run.planning`): DP is free,
  explicit TP/PP/CP and the micro-batch size stay constraints, the optimizer sharding the run
  planned is kept, and the global batch is kept (`launcher.elastic_batch=keep_global`: fewer
  DP replicas, more gradient accumulation);
- the new config.yaml and plan.json are written and the survivors are launched again; the
  ranks resume from the newest committed checkpoint, which megatron-core's dist-ckpt load
  reshards to the new layout;
- every `launcher.elastic_probe_s` the lost hosts are asked whether they answer ssh again; once
  one does and a checkpoint newer than the one the shrunk run resumed from is committed, the
  nodes are stopped (their ranks checkpoint the current step and exit) and the run is launched
  on the larger host set, the original layout when every host is back.

A host set the planner cannot use (fewer than `launcher.min_nodes`, or a layout that does not
fit) stops the run with one line saying what is missing. Every change is one log line
(`llmctl: elastic: ...`), a record appended to launch.json's `layout_changes` and an
`{"event": "layout_change", ...}` record in metrics.jsonl (written once the first step at the
new layout is logged, with the seconds lost).

SLURM (`launcher=slurm`): the script asks for `--nodes=MIN-MAX` and, before srun, runs
`python -m llmctl.launch.elastic replan RUN_DIR NODES` with the nodes granted
(`$SLURM_JOB_NUM_NODES`): the same re-plan, recorded the same way when the layout changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError

if TYPE_CHECKING:
    import subprocess

    from llmctl.config.schema import RootConfig
    from llmctl.launch.backend import Outcome, Started, TrainLaunch
    from llmctl.launch.common import RankExits
    from llmctl.launch.hostfile import Host
    from llmctl.launch.torchrun import NodeCommand
    from llmctl.plan import Layout

BATCH_POLICIES = ("keep_global",)
"""`launcher.elastic_batch` values: keep_global = the global batch stays, gradient accumulation
grows as DP shrinks (the loss curve's batch, LR schedule and consumed samples are unchanged)."""
LOST_PROBE_S = 5.0  # how long the probe after a failure waits for one host's ssh answer
EVENT = "layout_change"


def check_elastic(cfg: RootConfig) -> None:
    """The elastic fields, checked before planning (pure).

    Raises:
        UserError: elastic on a launcher without nodes to lose, without checkpoints to resume
            from, with torchrun's own restarts, or a bad min_nodes / batch policy / probe.
    """
    lc = cfg.launcher
    if not lc.elastic:
        return
    kind = str(lc.kind)
    if kind not in ("torchrun", "slurm"):
        raise UserError(
            f"launcher.elastic=true needs launcher=torchrun or launcher=slurm (launcher={kind} "
            "runs on one node)"
        )
    if str(lc.elastic_batch) not in BATCH_POLICIES:
        raise UserError(
            f"launcher.elastic_batch must be {' or '.join(BATCH_POLICIES)}, got {lc.elastic_batch}"
        )
    if not 1 <= lc.min_nodes <= cfg.cluster.num_nodes:
        raise UserError(
            f"launcher.min_nodes must be in 1..cluster.num_nodes={cfg.cluster.num_nodes}, "
            f"got {lc.min_nodes}"
        )
    if lc.elastic_probe_s <= 0:
        raise UserError(f"launcher.elastic_probe_s must be > 0, got {lc.elastic_probe_s}")
    if kind == "torchrun" and lc.max_restarts:
        raise UserError(
            "launcher.elastic=true restarts by re-planning; set launcher.max_restarts=0 "
            f"(got {lc.max_restarts})"
        )
    if cfg.checkpoint.interval < 1:
        raise UserError(
            "launcher.elastic=true resumes from checkpoints; set checkpoint.interval >= 1"
        )


def grad_accumulation(layout: Layout, global_batch_size: int) -> int:
    """Micro-batches per step on each DP replica (pure)."""
    return global_batch_size // (layout.micro_batch_size * layout.dp)


def replan(
    run_dir: Path,
    num_nodes: int,
    *,
    full_nodes: int,
    full_dp: int | None,
    force: bool = False,
    from_scratch: bool = False,
) -> TrainLaunch:
    """The best layout on `num_nodes` nodes, as `llmctl resume RUN --nodes N` plans it.

    DP is left to the planner (the original `parallel.dp`, `full_dp`, again once all
    `full_nodes` nodes are back); everything else of the saved config stays, the global batch
    included (keep_global). `from_scratch`: no checkpoint yet (a SLURM job's first start).

    Raises:
        UserError: No layout fits, or the run directory cannot resume (no valid checkpoint).
    """
    from llmctl.launch.ckpt_resume import prepare_resume

    dp = full_dp if num_nodes == full_nodes else None
    overrides = [f"cluster.num_nodes={num_nodes}", f"parallel.dp={'null' if dp is None else dp}"]
    return prepare_resume(run_dir, overrides, ignore_fit=force, restart_from_scratch=from_scratch)


def commit_replan(new: TrainLaunch) -> None:
    """Write the re-planned config.yaml and plan.json (and move invalid checkpoints aside)."""
    from llmctl.launch.reentry import accept_run_dir
    from llmctl.run.rundir import create_run_dir

    accept_run_dir(new.resume_point)
    create_run_dir(new.cfg, new.plan)


def change_record(
    old: Layout,
    new: TrainLaunch,
    *,
    reason: str,
    hosts: list[str],
    lost: list[str],
    detected_at: float,
) -> dict[str, Any]:
    """One `layout_changes` entry (seconds_lost filled in once the first step is logged)."""
    from llmctl.run.layout import layout_record

    gbs = int(new.cfg.train.global_batch_size)
    step = new.resume_point.step if new.resume_point is not None else None
    return {
        "time": detected_at,
        "reason": reason,
        "hosts": hosts,
        "lost_hosts": lost,
        "old_layout": layout_record(old, gbs),
        "new_layout": layout_record(new.layout, gbs),
        "old_grad_accumulation": grad_accumulation(old, gbs),
        "new_grad_accumulation": grad_accumulation(new.layout, gbs),
        "batch_policy": str(new.cfg.launcher.elastic_batch),
        "from_step": step,
        "relaunched_at": None,
        "first_step_at": None,
        "seconds_lost": None,
    }


def change_line(rec: dict[str, Any], old: Layout, new: Layout) -> str:
    """The one log line of a layout change."""
    hosts, gbs = ",".join(rec["hosts"]), rec["old_layout"]["global_batch_size"]
    return (
        f"llmctl: elastic: {rec['reason']}; layout {old.short()} -> {new.short()} on "
        f"{len(rec['hosts'])} node(s) ({hosts}), global batch {gbs}"
        f" kept (gradient accumulation {rec['old_grad_accumulation']} -> "
        f"{rec['new_grad_accumulation']}); "
        + (f"resuming from step {step}" if (step := rec["from_step"]) else "starting at step 1")
    )


def append_event(run_dir: Path, rec: dict[str, Any]) -> None:
    """The change as one metrics.jsonl record, appended in one write (rank 0 appends too).

    Its `step` is the step the new layout resumed from (0: from scratch), so the ranks'
    metrics log (which moves records past the step it resumes from) keeps it.
    """
    from llmctl.run.rundir import METRICS_FILE

    line = json.dumps({"event": EVENT, "step": rec["from_step"] or 0, **rec}) + "\n"
    try:
        fd = os.open(run_dir / METRICS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as e:
        print(f"llmctl: cannot write {METRICS_FILE} ({e.strerror})", file=sys.stderr, flush=True)


def first_step_after(run_dir: Path, step: int, since: float) -> float | None:
    """Time of the first metrics record past `step` logged at or after `since`, if any."""
    from llmctl.run.rundir import METRICS_FILE

    path = run_dir / METRICS_FILE
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                rec = json.loads(line)
                s, t = rec.get("step"), rec.get("time")
                if "event" not in rec and s > step and t >= since:
                    return float(t)
    return None


@dataclass(slots=True)
class _Prober:
    """Asks the lost hosts, every `period_s`, whether they answer ssh again (own thread)."""

    cfg: RootConfig
    hosts: list[str]
    period_s: float
    answered: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while self.hosts and not self.stop.wait(self.period_s):
            for host in self.hosts:
                if host not in self.answered and host_up(self.cfg, host, LOST_PROBE_S):
                    self.answered.append(host)


def host_up(cfg: RootConfig, host: str, timeout_s: float) -> bool:
    """Whether `host` accepts an ssh command now (the launch's ssh options)."""
    from llmctl.launch.torchrun import NodeCommand, host_answers, ssh_base

    probe = NodeCommand(host=host, node_rank=-1, argv=(), ssh_argv=(*ssh_base(cfg), host, ""))
    return host_answers(probe, timeout_s)


@dataclass(slots=True)
class _Epoch:
    """How one launch at one layout ended."""

    rcs: list[int | None]
    failed_at: float | None
    grown: bool
    stop_at: float
    first_step_at: float | None


def _supervise(
    nodes: list[NodeCommand],
    run_dir: Path,
    echo: TextIO | None,
    exits: RankExits,
    *,
    prober: _Prober | None,
    resumed_step: int | None,
    started_at: float,
    on_first_step: Callable[[float], None] | None = None,
) -> _Epoch:
    """Run the nodes until they end, one fails, or (shrunk) a lost host answers again and a
    newer checkpoint is committed: then stop them (the ranks checkpoint and exit)."""
    from llmctl.launch.torchrun import FAILURE_GRACE_S, _start_node, _stop_nodes
    from llmctl.run import ckpt_store as store

    log_dir = run_dir / "logs"
    copiers: list[threading.Thread] = []
    procs: list[subprocess.Popen[bytes]] = [
        _start_node(n, log_dir, echo, copiers, exits) for n in nodes
    ]
    failed_at: float | None = None
    grown = False
    stop_at = 0.0
    first: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if first is None and resumed_step is not None:
                first = first_step_after(run_dir, resumed_step, started_at)
                if first is not None and on_first_step is not None:
                    on_first_step(first)
            if not grown and failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = time.time()
            if failed_at is not None and time.time() - failed_at > FAILURE_GRACE_S:
                break
            if failed_at is None and not grown and prober is not None and prober.answered:
                newest = store.read_latest(run_dir / "checkpoints") or 0
                if first is not None and newest > (resumed_step or 0):
                    grown, stop_at = True, time.time()
                    for p in procs:  # the node wrapper stops torchrun: ranks checkpoint, exit
                        if p.stdin is not None:
                            with contextlib.suppress(OSError):
                                p.stdin.close()
            time.sleep(max(0.0, 0.2 - (time.monotonic() - now)))
    finally:
        _stop_nodes(procs)
        for t in copiers:
            t.join(timeout=5)
    return _Epoch([p.poll() for p in procs], failed_at, grown, stop_at, first)


def _lost_hosts(cfg: RootConfig, hosts: list[str], rcs: list[int | None]) -> list[str]:
    """Hosts whose session ended with ssh's 255, or that do not answer ssh now."""
    from llmctl.launch.torchrun import SSH_LOST

    asked = [h for h, rc in zip(hosts, rcs, strict=True) if rc != SSH_LOST]
    up: dict[str, bool] = {}
    if asked:
        with ThreadPoolExecutor(max_workers=min(32, len(asked))) as pool:
            up = dict(
                zip(asked, pool.map(lambda h: host_up(cfg, h, LOST_PROBE_S), asked), strict=True)
            )
    return [h for h in hosts if not up.get(h, False)]


def run_elastic(launch: TrainLaunch, *, echo: TextIO | None, started: Started) -> Outcome:
    """Run an ssh launch elastically (see the module docstring) to its end.

    Returns:
        The last launch's outcome: 0 when training finished; a rank's code for a failure that
        lost no host; 1 with the one-line reason when the hosts left cannot hold the run.
    """
    from llmctl.launch.backend import Outcome
    from llmctl.launch.common import RankExits, run_name
    from llmctl.launch.hostfile import read_hostfile
    from llmctl.launch.torchrun import render_torchrun_nodes

    original = launch.cfg
    run_dir = launch.run_dir
    every: list[Host] = list(read_hostfile(str(original.launcher.hostfile)))
    every = every[: original.cluster.num_nodes]
    active = list(every)
    current = launch
    changes: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    out = sys.stderr if echo is None else echo
    started({"layout_changes": changes})
    epoch = 0
    while True:
        nodes = render_torchrun_nodes(
            current.cfg,
            run_dir,
            tuple(active),
            current.layout,
            rdzv_id=f"{run_name(run_dir)}-{epoch}",
        )
        lost_now = [h.name for h in every if h not in active]
        prober = _Prober(original, lost_now, float(original.launcher.elastic_probe_s))
        threading.Thread(target=prober.run, daemon=True).start()
        exits = RankExits()
        t0 = time.time()
        step0 = current.resume_point.step if current.resume_point is not None else None

        def resumed(at: float, rec: dict[str, Any] | None = pending) -> None:
            """The first step at the new layout: the change's seconds lost are known."""
            if rec is not None:
                rec.update(first_step_at=at, seconds_lost=round(at - rec["time"], 3))
                append_event(run_dir, rec)
                started({"layout_changes": changes})

        try:
            end = _supervise(
                nodes, run_dir, echo, exits, prober=prober if lost_now else None,
                resumed_step=step0 if pending is not None else None, started_at=t0,
                on_first_step=resumed,
            )  # fmt: skip
        finally:
            prober.stop.set()
        if pending is not None and end.first_step_at is None:  # no step at that layout
            append_event(run_dir, pending)
        pending = None
        rcs = end.rcs
        if end.grown:
            detected = end.stop_at
            back = [h for h in every if h in active or h.name in prober.answered]
            reason = f"host(s) {','.join(prober.answered)} answer again"
            timings = {"ended_s": round(time.time() - end.stop_at, 3)}
        elif all(rc == 0 for rc in rcs):
            return Outcome(exit_code=0)
        else:
            detected = end.failed_at or time.time()
            first_rc = next((rc for rc in rcs if rc not in (None, 0)), 1) or 1
            ended_at = time.time()
            gone = _lost_hosts(original, [h.name for h in active], rcs)
            timings = {"ended_s": round(ended_at - detected, 3),
                       "probe_s": round(time.time() - ended_at, 3)}  # fmt: skip
            if not gone:  # a failure of the run itself, not of a host
                return Outcome(exit_code=exits.exit_code(first_rc), reason=exits.reason())
            back = [h for h in active if h.name not in gone]
            reason = f"host(s) {','.join(gone)} lost"
            if len(back) < int(original.launcher.min_nodes):
                line = (
                    f"llmctl: elastic: {reason}; {len(back)} node(s) left "
                    f"({','.join(h.name for h in back) or 'none'}) but launcher.min_nodes="
                    f"{original.launcher.min_nodes}: missing "
                    f"{int(original.launcher.min_nodes) - len(back)} node(s); stopping"
                )
                print(line, file=out, flush=True)
                return Outcome(exit_code=1, reason=line.removeprefix("llmctl: "))
        planned_at = time.time()
        try:
            new = replan(
                run_dir, len(back), full_nodes=original.cluster.num_nodes,
                full_dp=original.parallel.dp, force=bool(original.train.force),
            )  # fmt: skip
        except UserError as e:
            line = (
                f"llmctl: elastic: {reason}; cannot continue on {len(back)} node(s) "
                f"({','.join(h.name for h in back)}): {e.message}"
            )
            print(line, file=out, flush=True)
            return Outcome(exit_code=1, reason=line.removeprefix("llmctl: "))
        commit_replan(new)
        rec = change_record(
            current.layout, new, reason=reason, hosts=[h.name for h in back],
            lost=[h.name for h in every if h not in back], detected_at=detected,
        )  # fmt: skip
        rec.update(timings, replan_s=round(time.time() - planned_at, 3))
        print(change_line(rec, current.layout, new.layout), file=out, flush=True)
        rec["relaunched_at"] = time.time()
        changes.append(rec)
        started({"layout_changes": changes})
        pending, current, active, epoch = rec, new, back, epoch + 1


def replan_granted(run_dir: Path, nodes: int, out: TextIO | None = None) -> dict[str, Any] | None:
    """SLURM: plan the run for the `nodes` the job was granted, before srun starts the ranks.

    The run's size when submitted is kept in launch.json (`elastic_original`); a job granted
    another node count gets the planner's layout for it, recorded as a layout change (its
    `seconds_lost` stays null: the time the job waited in the queue is SLURM's). Returns the
    change record, or None when the layout already fits the nodes granted.

    Raises:
        UserError: Fewer nodes than launcher.min_nodes, or no layout fits them.
    """
    from llmctl.config import load_resolved
    from llmctl.launch.api import read_launch, write_launch
    from llmctl.run import ckpt_store as store
    from llmctl.run.layout import resolve_layout
    from llmctl.run.rundir import CONFIG_FILE, read_plan

    cfg = load_resolved(run_dir / CONFIG_FILE)
    record = read_launch(run_dir)
    first = record.setdefault(
        "elastic_original", {"num_nodes": cfg.cluster.num_nodes, "dp": cfg.parallel.dp}
    )
    granted = slurm_hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
    before = [str(h) for h in record.get("slurm_nodes") or []]
    record["slurm_nodes"] = granted
    lost = [h for h in before if h not in granted]
    if nodes == cfg.cluster.num_nodes:
        write_launch(run_dir, record)
        return None
    if nodes < cfg.launcher.min_nodes:
        raise UserError(
            f"elastic: the job was granted {nodes} node(s) but launcher.min_nodes="
            f"{cfg.launcher.min_nodes}: missing {cfg.launcher.min_nodes - nodes} node(s)"
        )
    plan = read_plan(run_dir)
    old = resolve_layout(cfg, None, plan.layout if plan is not None else None)
    try:
        new = replan(
            run_dir, nodes, full_nodes=int(first["num_nodes"]), full_dp=first["dp"],
            force=bool(cfg.train.force),
            from_scratch=not store.committed_steps(run_dir / "checkpoints"),
        )  # fmt: skip
    except UserError as e:
        raise UserError(f"elastic: cannot continue on {nodes} node(s): {e.message}") from None
    commit_replan(new)
    at = time.time()
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    reason = f"SLURM granted {nodes} of {first['num_nodes']} node(s)"
    if restart:
        reason = f"SLURM restart {restart} granted {nodes} of {first['num_nodes']} node(s)"
        if lost:
            reason += f" ({','.join(lost)} not granted again)"
    rec = change_record(
        old, new, reason=reason, hosts=granted or ["?"], lost=lost, detected_at=at
    )  # fmt: skip
    rec["relaunched_at"] = at
    print(change_line(rec, old, new.layout), file=sys.stderr if out is None else out, flush=True)
    append_event(run_dir, rec)
    record.setdefault("layout_changes", []).append(rec)
    write_launch(run_dir, record)
    return rec


def slurm_hostnames(nodelist: str) -> list[str]:
    """A SLURM node list (`h[0-1],gpu7`) as host names, by `scontrol show hostnames` (a list
    without ranges is split at its commas; a range scontrol cannot expand stays one name)."""
    import subprocess

    if not nodelist or "[" not in nodelist:
        return [h for h in nodelist.split(",") if h]
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return [nodelist]
    return out.split() or [nodelist]


def settle_seconds_lost(run_dir: Path, record: dict[str, Any]) -> None:
    """SLURM: fill in `seconds_lost` of the layout changes this job made, from metrics.jsonl
    (called when the job's srun has returned; in place).

    No process of the job is left between the re-plan before srun and the first step, so the
    figure is taken afterwards: the time from the last step logged before the change (the
    step in flight when a node was lost) to the first step logged at the new layout. A change
    at the job's first start (nothing trained before it) keeps null: that wait is SLURM's queue.
    """
    from llmctl.run.rundir import METRICS_FILE

    times: list[float] = []
    with contextlib.suppress(OSError):
        for line in (run_dir / METRICS_FILE).read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
                rec = json.loads(line)
                if "event" not in rec:
                    times.append(float(rec["time"]))
    for change in record.get("layout_changes") or []:
        at = change.get("relaunched_at")
        if change.get("seconds_lost") is not None or at is None or not change.get("from_step"):
            continue
        first = first_step_after(run_dir, int(change["from_step"]), float(at))
        before = [t for t in times if t < change["time"]]
        if first is not None and before:
            change["first_step_at"] = first
            change["seconds_lost"] = round(first - max(before), 3)


def grow_ready(run_dir: Path) -> bool:
    """SLURM growth: whether the shrunk run has committed a checkpoint past the step its last
    layout change resumed from (so growing back loses no progress and a node that comes and
    goes cannot restart the job over and over without training)."""
    from llmctl.launch.api import read_launch
    from llmctl.run import ckpt_store as store

    try:
        changes = read_launch(run_dir).get("layout_changes") or []
    except (OSError, ValueError):
        return False
    since = int(changes[-1].get("from_step") or 0) if changes else 0
    latest = store.read_latest(run_dir / "checkpoints")
    return latest is not None and latest > since


USAGE = "usage: python -m llmctl.launch.elastic replan RUN_DIR NODES | grow-ready RUN_DIR"


def main(argv: list[str] | None = None) -> int:
    """`replan RUN_DIR NODES` (the SLURM script, before srun): exit 2 with one line if the
    nodes granted cannot hold the run. `grow-ready RUN_DIR` (its growth watch): exit 0 once a
    checkpoint newer than the last change's is committed, else 1."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "grow-ready":
        return 0 if grow_ready(Path(args[1])) else 1
    if len(args) != 3 or args[0] != "replan" or not args[2].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    try:
        replan_granted(Path(args[1]), int(args[2]))
    except UserError as e:
        print(f"llmctl: {e.message}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
