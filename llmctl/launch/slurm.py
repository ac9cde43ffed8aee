"""`launcher=slurm`: an sbatch script that runs one torchrun per node under srun.

The script (pure rendering, pinned by golden files) asks for the nodes, one task per node with
its CPUs (and GPUs on GPU clusters), takes the rendezvous host from the allocation
(`scontrol show hostnames`), refuses a rendezvous host that resolves to loopback in multi-node
jobs, and handles the time limit: `--signal=B:USR1@<lead>` reaches the batch shell, which sends
SIGTERM to the job steps (torchrun gives the workers 30 s to checkpoint and exit) and then
requeues the job; `--open-mode=append` keeps the log across restarts. srun runs under llmctl's
wrapper (`launch.node`, in the batch step), so the job ends with the code a rank reported (3 for
the failed-save stop, 143 after a preemption checkpoint: `scontrol`/`sacct` ExitCode 3:0), not
torchrun's 1; the script records it in launch.json for `llmctl status`.

Every user value in the script is shell-quoted; secrets appear by name only (`--export=ALL,NAME`
takes their values from the submitting environment at submit time).

`SlurmBackend` is this launcher's `launch.backend.Backend`: it submits through
`llmctl.sbatch.submit` (as the data jobs do), reads a job's state with `scontrol show job` (no
accounting needed) and cancels it with `scancel`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.common import (
    NODE_MODULE,
    entry_args,
    launch_env,
    launch_shape,
    layout_of,
    node_prefix,
    python_of,
    run_name,
    torchrun_prefix,
)

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.launch.backend import Backend, Outcome, Started, TrainLaunch
    from llmctl.launch.jobs import RunStatus
    from llmctl.plan import Layout
    from llmctl.run.lock import RunLock

SCRIPT_NAME = "launch.sbatch"
PLACEMENT_MODULE = "llmctl.launch.placement"
JOB_ID_FILE = "slurm_job_id"
_TIME_RE = re.compile(r"^(?:\d+-)?\d+(?::\d+){0,2}$|^(?:UNLIMITED|INFINITE|infinite)$")
_SIGNAL_RE = re.compile(r"^(?:B:)?(?:SIG)?([A-Z0-9]+)(?:@(\d+))?$")


# torchrun arguments that must expand in the job (ours, not user values; never quoted).
_EXPANDED = (
    '--nnodes="$SLURM_NNODES"',
    '--rdzv-endpoint="$head_node:$rdzv_port"',
    '--rdzv-id="$SLURM_JOB_ID"',
)


# The script adds `SLURM_JOB_ID % 1000` to launcher.rdzv_port (distinct per job on shared nodes).
PORT_SPREAD = 1000

# Default checkpoint interval of a requeueable job: a tenth of the run, at most this many steps.
MAX_DEFAULT_CHECKPOINT_INTERVAL = 1000


def requeue_checkpoint_interval(cfg: RootConfig) -> int | None:
    """The checkpoint interval a requeueable SLURM job gets when it has none (0 = off).

    Without checkpoints a preemption notice saves nothing and the requeued job starts over at
    step 1. The default is `max(1, min(train_iters // 10, 1000))` steps; the checkpointer also
    saves when the notice arrives. Jobs that should not checkpoint set
    `launcher.slurm_requeue=false`.

    Returns:
        The interval to set, or None when the config keeps its own (pure).
    """
    if not cfg.launcher.slurm_requeue or cfg.checkpoint.interval > 0:
        return None
    return max(1, min(int(cfg.train.train_iters) // 10, MAX_DEFAULT_CHECKPOINT_INTERVAL))


def output_pattern(run_dir: str | Path) -> str:
    """Where SLURM writes the job's output (%j = job id; kept across requeues)."""
    return f"{run_dir}/slurm-%j.out"


def _value(name: str, value: object) -> str:
    """A user value for an #SBATCH line, shell-quoted; sbatch honours single quotes."""
    text = str(value)
    if "\n" in text or "'" in text or not text:
        raise UserError(f"{name}={text!r}: empty, or contains a newline or a quote")
    return shlex.quote(text)


def _signal(spec: str) -> str:
    match = _SIGNAL_RE.match(spec.strip())
    if not match:
        raise UserError(f"launcher.slurm_signal={spec!r} is not SIGNAL@SECONDS (e.g. USR1@90)")
    if match.group(1) in ("TERM", "KILL", "STOP"):
        raise UserError(
            f"launcher.slurm_signal={spec!r}: use USR1 or USR2 (TERM and KILL are SLURM's own)"
        )
    return f"B:{match.group(1)}@{match.group(2) or 90}"


def _switches(cfg: RootConfig) -> str | None:
    """`--switches=K[@WAIT]`: the fewest leaf switches that hold the run's nodes (the plan's
    non-blocking network, `plan.placement`), when the cluster states its leaf size and the
    run has several nodes; None otherwise."""
    lc = cfg.launcher
    nps = cfg.cluster.nodes_per_switch
    if str(lc.placement) == "off" or nps is None or cfg.cluster.num_nodes < 2:
        return None
    count = -(-cfg.cluster.num_nodes // nps)
    if lc.slurm_switch_wait is None:
        return f"--switches={count}"
    if not _TIME_RE.match(str(lc.slurm_switch_wait)):
        raise UserError(
            f"launcher.slurm_switch_wait={lc.slurm_switch_wait!r} is not [D-]HH:MM:SS or MM"
        )
    return f"--switches={count}@{lc.slurm_switch_wait}"


def checks_placement(cfg: RootConfig) -> bool:
    """Whether the job checks its nodes' leaf switches before any rank starts."""
    return str(cfg.launcher.placement) != "off" and cfg.cluster.num_nodes > 1


def _directives(cfg: RootConfig, run_dir: str | Path, nproc: int) -> list[str]:
    lc = cfg.launcher
    if not _TIME_RE.match(str(lc.slurm_time)):
        raise UserError(f"launcher.slurm_time={lc.slurm_time!r} is not [D-]HH:MM:SS or MM")
    cpus = cfg.cluster.cpu_cores if cfg.cluster.cpu_cores else nproc
    nodes = _nodes(cfg)
    lines = [
        f"--job-name={_value('launcher.slurm_job_name', lc.slurm_job_name or run_name(run_dir))}",
        f"--nodes={nodes}",
    ]
    # A node range with --ntasks-per-node makes the job's task count MIN x 1, and SLURM never
    # allocates more nodes than tasks: the job would always start on MIN nodes. Without it the
    # job gets as many nodes of the range as are free (measured on the netns cluster); srun
    # places one task per node itself.
    if "-" not in nodes:
        lines.append("--ntasks-per-node=1")
    lines.append(f"--cpus-per-task={cpus}")
    switches = _switches(cfg)
    if switches:
        lines.append(switches)
    if cfg.cluster.device == "cuda":
        lines.append(f"--gpus-per-node={nproc}")
    lines.append(f"--time={_value('launcher.slurm_time', lc.slurm_time)}")
    if lc.slurm_partition:
        lines.append(f"--partition={_value('launcher.slurm_partition', lc.slurm_partition)}")
    if lc.slurm_account:
        lines.append(f"--account={_value('launcher.slurm_account', lc.slurm_account)}")
    lines += [
        f"--output={_value('train.run_dir', output_pattern(run_dir))}",
        "--open-mode=append",
        f"--signal={_signal(lc.slurm_signal)}",
        "--requeue" if lc.slurm_requeue else "--no-requeue",
        "--export=" + ",".join(["ALL", *lc.secrets]),
    ]
    for extra in lc.slurm_extra:
        if "\n" in str(extra) or not str(extra).startswith("-"):
            raise UserError(f"launcher.slurm_extra entry {extra!r} must be one --option")
        lines.append(str(extra))
    return [f"#SBATCH {line}" for line in lines]


def _nodes(cfg: RootConfig) -> str:
    """`--nodes`: the run's count, or `MIN-MAX` for an elastic run (launch.elastic)."""
    n = cfg.cluster.num_nodes
    lc = cfg.launcher
    return f"{lc.min_nodes}-{n}" if lc.elastic and lc.min_nodes < n else str(n)


def render_sbatch(cfg: RootConfig, run_dir: str | Path, layout: Layout | None = None) -> str:
    """The sbatch script of a run (pure).

    Args:
        cfg: The resolved RootConfig (`cluster.num_nodes` nodes).
        run_dir: The run directory (on a filesystem every node sees).
        layout: The resolved layout; None = the one the config alone implies.

    Raises:
        UserError: A world size the layout cannot hold, or a malformed launcher value.
    """
    shape = launch_shape(cfg, layout_of(cfg, layout), cfg.cluster.num_nodes)
    env = launch_env(cfg, shape)
    q = shlex.quote
    cpus = cfg.cluster.cpu_cores if cfg.cluster.cpu_cores else shape.nproc_per_node
    options = [
        _EXPANDED[0],
        q(f"--nproc-per-node={shape.nproc_per_node}"),
        "--rdzv-backend=c10d",
        *_EXPANDED[1:],
        f"--max-restarts={int(cfg.launcher.max_restarts)}",
    ]
    python = python_of(cfg)
    cmd = " ".join(q(a) for a in torchrun_prefix(python))
    cmd += "".join(f" \\\n    {o}" for o in options)
    cmd += " \\\n    " + " ".join(q(a) for a in entry_args(run_dir))
    secrets = " ".join(q(s) for s in cfg.launcher.secrets)
    lines = [
        "#!/bin/bash",
        f"# Rendered by llmctl for run {q(str(run_dir))}.",
        f"# Submit: sbatch --parsable {q(str(Path(run_dir) / SCRIPT_NAME))}",
        *_directives(cfg, run_dir, shape.nproc_per_node),
        "",
        "set -uo pipefail",
        f"cd {q(str(run_dir))} || exit 2",
        *(f"export {k}={q(v)}" for k, v in env.items()),
    ]
    if secrets:
        lines += [
            "# Secrets come by name from the submitting environment (--export), never from here.",
            f"for name in {secrets}; do",
            '  [[ -n "${!name:-}" ]] || echo "llmctl: warning: secret $name is not set" >&2',
            "done",
        ]
    py = q(python)
    if cfg.cluster.device == "cuda":  # refuse at once when a node differs from the plan
        lines += [
            f'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 {py} -m llmctl.topology.preflight '
            f"{q(str(run_dir))} || exit 2",
        ]
    if cfg.launcher.elastic:  # plan for the nodes granted (launch.elastic), before any rank
        lines += [
            "# Elastic: re-plan for the nodes granted; one line and exit 2 if none fits.",
            f'{py} -m llmctl.launch.elastic replan {q(str(run_dir))} "$SLURM_JOB_NUM_NODES" '
            f"|| {{ {py} -m {NODE_MODULE} record {q(str(run_dir))} 2; exit 2; }}",
        ]
    if checks_placement(cfg):  # the nodes granted against the plan's leaf switches
        lines += [
            "# Placement: the nodes' leaf switches against the plan (launcher.placement).",
            f"{py} -m {PLACEMENT_MODULE} {q(str(run_dir))} "
            f"|| {{ {py} -m {NODE_MODULE} record {q(str(run_dir))} 2; exit 2; }}",
        ]
    lines += _BODY.format(
        port=int(cfg.launcher.rdzv_port),
        spread=PORT_SPREAD,
        cpus=cpus,
        cmd=cmd,
        sig=_signal(cfg.launcher.slurm_signal)[2:].split("@")[0],
        requeue_note="; then requeue" if cfg.launcher.slurm_requeue else "",
        requeue_block=_REQUEUE if cfg.launcher.slurm_requeue else "",
        wrapper=" ".join(q(a) for a in node_prefix(python)),
        record=f'{py} -m {NODE_MODULE} record {q(str(run_dir))} "$rc"',
        grow=_grow_block(cfg, python, run_dir),
        grow_stop='[[ -z $grow_pid ]] || kill "$grow_pid" 2>/dev/null\n' if grows(cfg) else "",
    ).splitlines()
    return "\n".join(lines) + "\n"


_BODY = """
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
if (( SLURM_NNODES > 1 )); then
  head_addr=$(getent ahostsv4 "$head_node" | awk 'NR==1{{print $1}}')
  case "$head_addr" in
    ''|127.*)
      echo "llmctl: rendezvous host $head_node resolves to '$head_addr' (loopback or" \\
        "nothing) on $(hostname): other nodes cannot reach it; map it to its network" \\
        "address in /etc/hosts" >&2
      exit 2 ;;
  esac
fi
rdzv_port=$(( {port} + SLURM_JOB_ID % {spread} ))  # distinct per job on shared nodes
echo "llmctl: job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST," \\
  "rendezvous $head_node:$rdzv_port"

# Time limit notice: SLURM sends --signal to this shell only. Pass SIGTERM to the job steps
# (torchrun forwards it to the workers and waits 30 s for them: time to checkpoint){requeue_note}.
# `kill` on srun would cancel the step at once instead. A SIGTERM to this shell (scancel,
# scheduler preemption) has already reached the steps: wait for them, never requeue from here.
preempted=0
llmctl_notice() {{
  preempted=1
  echo "llmctl: caught SIG{sig}: asking the ranks to checkpoint and exit" >&2
  scancel --signal=TERM "$SLURM_JOB_ID"
}}
trap llmctl_notice {sig}
trap 'echo "llmctl: caught SIGTERM: waiting for the ranks to exit" >&2' TERM

# srun runs under llmctl's wrapper, which copies its output and exits with the code a rank
# reported (3: failed saves, 143: preempted), not torchrun's 1 (torchrun's for any other end).
{wrapper} \\
  srun --kill-on-bad-exit=1 --nodes="$SLURM_NNODES" --ntasks-per-node=1 --cpus-per-task={cpus} \\
  {cmd} &
run_pid=$!
{grow}while :; do
  wait "$run_pid"
  rc=$?
  kill -0 "$run_pid" 2>/dev/null || break
done
{grow_stop}{record}
{requeue_block}exit "$rc"
"""


def grows(cfg: RootConfig) -> bool:
    """Whether the job watches for nodes to grow back to (elastic, a node range, requeue on)."""
    lc = cfg.launcher
    return bool(lc.elastic and lc.min_nodes < cfg.cluster.num_nodes and lc.slurm_requeue)


def _grow_block(cfg: RootConfig, python: str, run_dir: str | Path) -> str:
    """Elastic growth: a job running on fewer nodes than it asked for watches its partition;
    once enough nodes are idle to run at full size it takes the time-limit path (the ranks
    checkpoint, the job requeues itself) and its restart is re-planned for what it is granted."""
    if not grows(cfg):
        return ""
    full = cfg.cluster.num_nodes
    sig = _signal(cfg.launcher.slurm_signal)[2:].split("@")[0]
    probe = f"{float(cfg.launcher.elastic_probe_s):g}"
    ready = f"{shlex.quote(python)} -m llmctl.launch.elastic grow-ready {shlex.quote(str(run_dir))}"
    return f"""# Elastic growth: below {full} node(s), ask the partition every {probe} s;
# when enough nodes are idle and a checkpoint newer than the resumed one is committed,
# checkpoint and requeue (the restart is re-planned for the nodes it gets).
grow_pid=
if (( SLURM_JOB_NUM_NODES < {full} )); then
  ( while sleep {probe}; do
      idle=$(sinfo -h -N -p "$SLURM_JOB_PARTITION" -t idle -o '%N %T' 2>/dev/null \\
        | awk '$2 == "idle" && !seen[$1]++ {{c++}} END {{print c+0}}')  # not drained, answering
      if (( idle >= {full} - SLURM_JOB_NUM_NODES )) && {ready}; then
        echo "llmctl: elastic: $idle node(s) idle in partition $SLURM_JOB_PARTITION;" \\
          "checkpointing to grow back to {full} node(s)" >&2
        kill -{sig} $$
        exit 0
      fi
    done ) &
  grow_pid=$!
fi
"""


_REQUEUE = """if (( preempted )); then
  echo "llmctl: requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
"""


def check_slurm(cfg: RootConfig) -> None:
    """Requirements of `launcher=slurm`, checked before anything is written or started.

    Raises:
        UserError: sbatch not on PATH, or a secret not set in this environment.
    """
    if shutil.which("sbatch") is None:
        raise UserError(
            "sbatch not found on PATH: launcher=slurm needs the SLURM client tools (submit from "
            "a login node; for a local test cluster run scripts/slurm_local.sh up)"
        )
    for name in cfg.launcher.secrets:
        if name not in os.environ:
            raise UserError(f"secret {name} (launcher.secrets) is not set in this environment")


def execute_slurm(script: str, run_dir: str | Path) -> str:
    """Write the script into the run directory and submit it with `sbatch --parsable`.

    Returns:
        The job id (also written to RUN_DIR/slurm_job_id).

    Raises:
        UserError: sbatch refused the job (its message is included).
    """
    from llmctl.sbatch import SbatchFailed, submit

    path = Path(run_dir) / SCRIPT_NAME
    path.write_text(script)
    try:
        job_id = submit([str(path)], cwd=run_dir)
    except SbatchFailed as e:
        raise UserError(f"sbatch refused {path}: {e.last_line}") from None
    (Path(run_dir) / JOB_ID_FILE).write_text(job_id + "\n")
    return job_id


_FIELD_RE = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|$)")


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value fields) as a dict (pure)."""
    return {m.group(1): m.group(2) for m in _FIELD_RE.finditer(text.strip())}


def _slurm_tool(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The one place this module runs a SLURM client (`scontrol`, `scancel`; sbatch goes
    through `llmctl.sbatch`).

    Raises:
        UserError: The tool is not on PATH.
    """
    if shutil.which(argv[0]) is None:
        raise UserError(f"{argv[0]} not found on PATH: run this where the SLURM client tools are")
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o JOBID` as a dict; `JobState=GONE` for a job SLURM forgot."""
    proc = _slurm_tool(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {"JobState": "GONE"}
        raise UserError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
    return parse_scontrol(proc.stdout)


def job_status(job_id: str) -> RunStatus:
    """Status of a SLURM job by id; its run directory is found through the job's WorkDir.

    Raises:
        UserError: SLURM cannot be queried.
    """
    job = _scontrol_job(job_id)
    workdir = job.get("WorkDir")
    run_dir = Path(workdir) if workdir and (Path(workdir) / "config.yaml").is_file() else None
    return _slurm_status(run_dir, job_id, job)


def _slurm_status(run_dir: Path | None, job_id: str, job: dict[str, str]) -> RunStatus:
    from llmctl.launch.jobs import RunStatus, last_metrics, total_steps

    step, loss = last_metrics(run_dir) if run_dir else (None, None)
    restarts = job.get("Restarts")
    return RunStatus(
        run_dir=str(run_dir) if run_dir else None,
        kind="slurm",
        job_id=job_id,
        state=job.get("JobState", "UNKNOWN"),
        reason=_slurm_value(job.get("Reason")),
        exit_code=job.get("ExitCode"),
        restarts=int(restarts) if restarts else None,
        nodes=_slurm_value(job.get("NodeList")),
        elapsed=job.get("RunTime"),
        step=step,
        loss=loss,
        total_steps=total_steps(run_dir) if run_dir else None,
    )


def _job_id(run_dir: Path, record: dict[str, Any]) -> str:
    """The SLURM job id of a run: launch.json, else the slurm_job_id file.

    Raises:
        UserError: Neither names one (asking scontrol for "" would list every job).
    """
    from llmctl.launch.api import LAUNCH_FILE

    path = run_dir / JOB_ID_FILE
    job_id = str(record.get("job_id") or (path.read_text().strip() if path.is_file() else ""))
    if not job_id:
        raise UserError(
            f"{run_dir}: no SLURM job id in {LAUNCH_FILE} or {JOB_ID_FILE}; "
            "pass the job id itself: `llmctl status JOBID`"
        )
    return job_id


def _slurm_value(value: str | None) -> str | None:
    """scontrol's spelling of "no value" (`Reason=None`, `NodeList=(null)`) as None."""
    return None if value in (None, "", "None", "(null)") else value


@dataclass(frozen=True, slots=True)
class SbatchScript:
    """The rendering of a SLURM launch: the batch script."""

    text: str

    def describe(self) -> dict[str, Any]:
        """`sbatch` of the --dry-run --json view."""
        return {"sbatch": self.text}

    def sections(self) -> list[tuple[str, str]]:
        """The script, byte for byte."""
        return [("sbatch script", self.text.rstrip("\n"))]

    def recorded(self) -> dict[str, Any]:
        """Nothing: the script itself is kept as RUN_DIR/launch.sbatch."""
        return {}


class SlurmBackend:
    """`launcher=slurm`: an sbatch job; `llmctl train` returns once it is submitted."""

    holds_lock = False  # rank 0 of the job takes the lock
    port_spread = PORT_SPREAD - 1

    def configure(self, cfg: RootConfig) -> RootConfig:
        """A requeueable job checkpoints (`requeue_checkpoint_interval`)."""
        interval = requeue_checkpoint_interval(cfg)
        if interval is None:
            return cfg
        return replace(cfg, checkpoint=replace(cfg.checkpoint, interval=interval))

    def render(self, cfg: RootConfig, run_dir: Path, layout: Layout) -> SbatchScript:
        """`render_sbatch`."""
        return SbatchScript(render_sbatch(cfg, run_dir, layout))

    def check(self, launch: TrainLaunch) -> None:
        """sbatch on PATH and the secrets set here (`check_slurm`)."""
        check_slurm(launch.cfg)

    def execute(
        self, launch: TrainLaunch, *, echo: TextIO | None, lock: RunLock | None, started: Started
    ) -> Outcome:
        """Submit the script (`execute_slurm`), then record the job id."""
        from llmctl.launch.backend import Outcome

        if not isinstance(launch.rendering, SbatchScript):
            raise TypeError(f"launcher=slurm cannot run a {type(launch.rendering).__name__}")
        job_id = execute_slurm(launch.rendering.text, launch.run_dir)
        started({"job_id": job_id})
        return Outcome(job_id=job_id)

    def status(self, run_dir: Path, record: dict[str, Any]) -> RunStatus:
        """The job's state from scontrol; for a job SLURM forgot, the exit code its batch
        script recorded in launch.json."""
        job_id = _job_id(run_dir, record)
        status = _slurm_status(run_dir, job_id, _scontrol_job(job_id))
        if status.state == "GONE" and "exit_code" in record:  # recorded by the batch script
            return replace(status, exit_code=f"{record['exit_code']}:0")
        return status

    def log_path(self, run_dir: Path, record: dict[str, Any]) -> Path:
        """SLURM's output file, RUN_DIR/slurm-<job id>.out (kept across requeues)."""
        return run_dir / f"slurm-{_job_id(run_dir, record)}.out"

    def cancel(self, run_dir: Path, record: dict[str, Any]) -> None:
        """`scancel JOBID`: the steps get SIGTERM (the ranks checkpoint and exit), no requeue.

        Raises:
            UserError: scancel refused (its message is included).
        """
        job_id = _job_id(run_dir, record)
        proc = _slurm_tool(["scancel", job_id])
        if proc.returncode != 0:
            raise UserError(f"scancel {job_id} failed: {proc.stderr.strip()}")


if TYPE_CHECKING:  # mypy checks that the class implements the launcher protocol
    _PROTOCOL: type[Backend] = SlurmBackend
