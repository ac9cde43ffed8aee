"""`launcher=torchrun`: bare-metal multi-node. One torchrun per host of a hostfile, over ssh.

Rendering (pure) gives, per node, the torchrun argv, the remote shell command and the local ssh
argv. The first host is node 0: it hosts the c10d rendezvous store (`is_host=1`); every agent
advertises its hostfile name (`--local-addr`), so MASTER_ADDR is a name all nodes resolve.

Environment variables do not cross ssh, so they are written inline in the remote command;
secrets are not: the remote command reads their values from ssh's standard input, so only
their names appear in the rendering, in `ps` and in logs.

Before any process starts, `check_hosts` probes every host once over ssh (BatchMode): reachable,
the interpreter exists, the rendezvous host resolves, and neither it nor the host's own name
resolves to a loopback address in a multi-node run (the classic `127.0.1.1 hostname` trap).
On CUDA clusters it then runs the hardware preflight on every host (`check_hardware`: GPU
model, memory, count, NVLink domain, NICs against the plan's cluster, as the SLURM script does).

Each node's torchrun runs under the node wrapper (`launch.node`, `--watch-stdin`): it exits with
the rank's own code, ends what is left of the run on its host once torchrun exits, and stops the
node when its ssh session's standard input closes. The launcher keeps each session's standard
input open for the run's lifetime and closes it to stop a node; its ssh clients get SIGTERM if
the launcher dies (PR_SET_PDEATHSIG), so a killed launcher stops every node (sshd sends no signal
to a command without a terminal: a remote torchrun would otherwise run on).

With `--max-restarts` > 0 a node lost mid-run (its ssh session ends with 255: a host crash) is
brought back by running its rendered command again once the host answers ssh (`rejoin_node`);
torchrun's agents re-form the group and the ranks resume from the newest complete checkpoint.

With `launcher.elastic=true` the launcher restarts by re-planning instead (`launch.elastic`):
a lost host shrinks the layout to the hosts left, a host that answers again grows it back.

`TorchrunBackend` is this launcher's `launch.backend.Backend`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.common import (
    RankExits,
    entry_args,
    launch_env,
    launch_shape,
    layout_of,
    node_prefix,
    python_of,
    run_name,
    tee,
    torchrun_prefix,
)
from llmctl.launch.hostfile import Host, drop_excluded, read_hostfile

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.launch.backend import Backend, Outcome, Started, TrainLaunch
    from llmctl.launch.jobs import RunStatus
    from llmctl.plan import Layout
    from llmctl.run.lock import RunLock

PROBE_TIMEOUT_S = 30.0
FAILURE_GRACE_S = 10.0
SSH_LOST = 255  # ssh's exit status when the connection or the remote command was lost
REJOIN_RETRY_S = 2.0  # how often a lost host is asked whether it answers ssh again
REJOIN_TIMEOUT_S = 600.0  # torch's c10d rendezvous join timeout: how long survivors wait


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCommand:
    """What runs on one node and how it gets there."""

    host: str
    node_rank: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    remote_command: str = ""
    ssh_argv: tuple[str, ...] = ()


def ssh_base(cfg: RootConfig) -> list[str]:
    """`ssh` with non-interactive options and the user's launcher.ssh_options (pure)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    argv += [str(o) for o in cfg.launcher.ssh_options]
    if cfg.launcher.ssh_user:
        argv += ["-l", str(cfg.launcher.ssh_user)]
    return argv


def render_torchrun_nodes(
    cfg: RootConfig,
    run_dir: str | Path,
    hosts: tuple[Host, ...],
    layout: Layout | None = None,
    *,
    rdzv_id: str | None = None,
) -> list[NodeCommand]:
    """Per-node torchrun commands and their ssh wrapping (pure).

    Args:
        cfg: The resolved RootConfig; `cluster.num_nodes` hosts are used.
        run_dir: The run directory; it must be on a filesystem every node sees at this path.
        hosts: The parsed hostfile; the first `cluster.num_nodes` entries are used.
        layout: The resolved layout; None = the one the config alone implies.
        rdzv_id: The rendezvous id; None = the run's name (the elastic launcher gives each
            relaunch its own).

    Raises:
        UserError: Too few hosts, slots too small, or a world size the layout cannot hold.
    """
    num_nodes = cfg.cluster.num_nodes
    if len(hosts) < num_nodes:
        raise UserError(
            f"cluster.num_nodes={num_nodes} but the hostfile lists {len(hosts)} host(s); "
            f"add hosts to {cfg.launcher.hostfile} or pass --nodes {len(hosts)}"
        )
    shape = launch_shape(cfg, layout_of(cfg, layout), num_nodes)
    used = hosts[:num_nodes]
    for host in used:
        if host.slots is not None and host.slots < shape.nproc_per_node:
            raise UserError(
                f"host {host.name} has slots={host.slots} but each node runs "
                f"{shape.nproc_per_node} ranks; fix the hostfile or the layout"
            )
    env = launch_env(cfg, shape)
    secrets = tuple(str(s) for s in cfg.launcher.secrets)
    endpoint = f"{used[0].name}:{cfg.launcher.rdzv_port}"
    nodes = []
    for rank, host in enumerate(used):
        argv = (
            *node_prefix(python_of(cfg), watch_stdin=True),
            *torchrun_prefix(python_of(cfg)),
            f"--nnodes={num_nodes}",
            f"--nproc-per-node={shape.nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id or run_name(run_dir)}",
            f"--rdzv-conf=is_host={1 if rank == 0 else 0}",
            f"--local-addr={host.name}",
            f"--max-restarts={cfg.launcher.max_restarts}",
            *entry_args(run_dir),
        )
        node_env = {**env, "LLMCTL_NODE_RANK": str(rank)}
        remote = remote_command(run_dir, argv, node_env, secrets)
        ssh_argv = (*ssh_base(cfg), host.name, remote)
        nodes.append(
            NodeCommand(
                host=host.name,
                node_rank=rank,
                argv=argv,
                env=node_env,
                secrets=secrets,
                remote_command=remote,
                ssh_argv=ssh_argv,
            )
        )
    return nodes


def remote_command(
    cwd: str | Path, argv: tuple[str, ...], env: dict[str, str], secrets: tuple[str, ...]
) -> str:
    """The shell command a node runs: cd, read secrets from stdin, exec env ... ARGV.

    The rest of standard input stays with ARGV (the node wrapper watches it for its end).
    """
    parts = [f"cd {shlex.quote(str(cwd))}"]
    if secrets:
        reads = " && ".join(f"IFS= read -r {name}" for name in secrets)
        parts.append(f"{{ {reads}; }} && export {' '.join(secrets)}")
    pairs = [f"{k}={v}" for k, v in env.items()]
    parts.append("exec " + shlex.join(["env", *pairs, *argv]))
    return " && ".join(parts)


def probe_command(rdzv_host: str, python: str) -> str:
    """Shell text that reports what `check_probe` needs, one `key=value` per line."""
    q = shlex.quote
    return (
        'printf "host=%s\\n" "$(hostname)"; '
        f'printf "rdzv=%s\\n" "$(getent ahostsv4 {q(rdzv_host)} | awk \'NR==1{{print $1}}\')"; '
        'printf "self=%s\\n" "$(getent ahostsv4 "$(hostname)" | awk \'NR==1{print $1}\')"; '
        f"if [ -x {q(python)} ]; then echo python=ok; else echo python=missing; fi"
    )


def check_probe(
    host: str, rdzv_host: str, output: str, python: str, multi_node: bool, env: dict[str, str]
) -> None:
    """Judge one host's probe output (pure).

    Raises:
        UserError: Missing interpreter, an unresolvable rendezvous host, or (multi-node only) a
            rendezvous host or own hostname that resolves to loopback.
    """
    facts = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    if facts.get("python") != "ok":
        raise UserError(
            f"{python} not found on host {host}; set launcher.python to the interpreter path "
            "on the nodes (same venv on every node)"
        )
    rdzv = facts.get("rdzv", "")
    if not rdzv:
        raise UserError(
            f"rendezvous host {rdzv_host} does not resolve on {host}; add it to {host}'s "
            "/etc/hosts or list hosts by IP address in the hostfile"
        )
    if not multi_node:
        return
    if rdzv.startswith("127."):
        raise UserError(
            f"rendezvous host {rdzv_host} resolves to {rdzv} (loopback) on {host}, so the "
            f"other nodes cannot meet there; map {rdzv_host} to its network address in "
            "/etc/hosts (not 127.0.1.1) or list hosts by IP address in the hostfile"
        )
    own, self_addr = facts.get("host", "?"), facts.get("self", "")
    if self_addr.startswith("127.") and "GLOO_SOCKET_IFNAME" not in env:
        raise UserError(
            f"host {host} calls itself {own!r}, which resolves to {self_addr} (loopback): gloo "
            "would bind loopback and peers could not connect; map the hostname to its network "
            "address in /etc/hosts or set launcher.env.GLOO_SOCKET_IFNAME (and "
            "NCCL_SOCKET_IFNAME) to the cluster interface"
        )


def render_probe(cfg: RootConfig, host: str, rdzv_host: str, python: str) -> list[str]:
    """The ssh argv that probes one host before launch (pure)."""
    return [*ssh_base(cfg), host, probe_command(rdzv_host, python)]


def render_host_check(node: NodeCommand) -> list[str]:
    """The ssh argv asking whether a node's host answers (same options as its launch; pure)."""
    return [*node.ssh_argv[:-1], "true"]


def _spawn(
    argv: list[str] | tuple[str, ...], *, with_launcher: bool = False, **kwargs: Any
) -> subprocess.Popen[bytes]:
    """The one place this backend starts a process: a rendered ssh argv (launch, probe,
    host check); every argv it runs comes from a `render_*` function or `NodeCommand`.

    `with_launcher`: the ssh client gets SIGTERM when this process dies (node launches only,
    started from the main thread: the signal follows the thread that started the child).
    """
    if with_launcher:
        from llmctl.run.signals import parent_death_signal

        kwargs["preexec_fn"] = parent_death_signal(signal.SIGTERM)
    return subprocess.Popen(list(argv), **kwargs)


def _probe_one(
    cfg: RootConfig, host: str, rdzv_host: str, python: str
) -> tuple[str, int, str, str]:
    argv = render_probe(cfg, host, rdzv_host, python)
    proc = _spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return host, 255, "", f"no answer within {PROBE_TIMEOUT_S:.0f} s"
    return host, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def check_hosts(cfg: RootConfig, nodes: list[NodeCommand]) -> None:
    """Probe every node once over ssh, in parallel, before anything is launched.

    Raises:
        UserError: An unreachable host (naming it and the ssh error) or a probe finding.
    """
    rdzv_host = nodes[0].host
    python = python_of(cfg)
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        results = list(pool.map(lambda n: _probe_one(cfg, n.host, rdzv_host, python), nodes))
    for host, rc, out, err in results:
        if rc != 0:
            last = (err.strip().splitlines() or [f"exit code {rc}"])[-1]
            raise UserError(
                f"host {host} unreachable over ssh ({last}); check the hostfile and "
                "launcher.ssh_options (key-based login: ssh runs with BatchMode=yes)"
            )
        check_probe(host, rdzv_host, out, python, len(nodes) > 1, nodes[0].env)
    if cfg.cluster.device == "cuda":  # same preflight as the SLURM script, before any start
        check_hardware(cfg, nodes)


def render_hardware_probe(cfg: RootConfig, host: str, python: str) -> list[str]:
    """The ssh argv printing one host's hardware probe as JSON (pure)."""
    probe = shlex.join([python, "-m", "llmctl.topology.preflight", "--probe"])
    return [*ssh_base(cfg), host, probe]


def check_hardware(cfg: RootConfig, nodes: list[NodeCommand]) -> None:
    """Probe every host's GPUs, NVLink and NICs over ssh and compare with the plan's cluster.

    Raises:
        UserError: one line naming the first host that differs and how.
    """
    from llmctl.topology.preflight import hosts_refusal

    def one(host: str) -> tuple[str, str]:
        argv = render_hardware_probe(cfg, host, python_of(cfg))
        pipe = subprocess.PIPE
        proc = _spawn(argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
        try:
            out, _ = proc.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        return host, out.decode(errors="replace")

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        answers = dict(pool.map(one, [n.host for n in nodes]))
    line = hosts_refusal(cfg.cluster, answers)
    if line:
        raise UserError(line)


def secret_values(names: tuple[str, ...]) -> dict[str, str]:
    """Values of the named secrets from this environment.

    Raises:
        UserError: A secret that is unset or spans lines.
    """
    values = {}
    for name in names:
        value = os.environ.get(name)
        if value is None:
            raise UserError(f"secret {name} (launcher.secrets) is not set in this environment")
        if "\n" in value:
            raise UserError(f"secret {name} contains a newline; it cannot be passed over ssh")
        values[name] = value
    return values


def execute_torchrun(
    nodes: list[NodeCommand],
    log_dir: str | Path,
    echo: TextIO | None = None,
    *,
    exits: RankExits | None = None,
) -> int:
    """Start every node's torchrun over ssh and wait for all of them.

    Node 0's output is echoed to `echo` (stdout); each node's output goes to
    `log_dir/node<R>.log`. When a node fails, the others get FAILURE_GRACE_S to finish, then
    their ssh clients are closed (the remote agents end on the broken pipe).

    A node other than node 0 that is *lost* (its ssh session ends with 255: the host crashed,
    its agent was killed, or the connection broke) is brought back when torchrun may restart
    (`--max-restarts` > 0): once the host answers ssh again (checked every REJOIN_RETRY_S, for
    up to REJOIN_TIMEOUT_S), its rendered command is run again (`rejoin_node`), at most
    max_restarts times per node. The survivors' agents meanwhile wait in the rendezvous; the
    re-formed group resumes from the newest complete checkpoint. Node 0 hosts the rendezvous
    store, so its loss ends the run.

    Ranks report their own exit code in their output (`common.RankExits`); torchrun exits 1
    whatever its workers' codes, so a reported code replaces it.

    Returns:
        0 when every node succeeded, else the first non-zero exit code (a rank's own, if one
        was reported).
    """
    secret_values(nodes[0].secrets)  # fail before anything starts
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    exits = RankExits() if exits is None else exits
    copiers: list[threading.Thread] = []
    procs = [_start_node(node, log_dir, echo, copiers, exits) for node in nodes]
    try:
        rc = _wait_all(procs, nodes, log_dir, echo, copiers, exits)
    finally:
        _stop_nodes(procs)
        for t in copiers:
            t.join(timeout=5)
    return exits.exit_code(rc)


def _stop_nodes(procs: list[subprocess.Popen[bytes]], grace_s: float = 45.0) -> None:
    """Close every node's standard input (the node wrapper stops its torchrun: the ranks
    checkpoint and exit); ssh clients still running after `grace_s` are terminated."""
    for proc in procs:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.terminate()


def _start_node(
    node: NodeCommand,
    log_dir: str | Path,
    echo: TextIO | None,
    copiers: list[threading.Thread],
    exits: RankExits | None = None,
) -> subprocess.Popen[bytes]:
    """Run one node's ssh command: secrets on stdin, output appended to node<R>.log."""
    secrets = secret_values(node.secrets)
    payload = "".join(f"{secrets[n]}\n" for n in node.secrets).encode()
    pipe = subprocess.PIPE
    proc = _spawn(
        node.ssh_argv, with_launcher=True, stdin=pipe, stdout=pipe, stderr=subprocess.STDOUT
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(payload)  # then left open: the node runs until it is closed
    proc.stdin.flush()
    log = Path(log_dir) / f"node{node.node_rank}.log"
    shown = (sys.stdout if echo is None else echo) if node.node_rank == 0 else None
    t = threading.Thread(target=tee, args=(proc.stdout, log, shown, exits), daemon=True)
    t.start()
    copiers.append(t)
    return proc


def rejoin_node(
    node: NodeCommand,
    log_dir: str | Path,
    echo: TextIO | None = None,
    copiers: list[threading.Thread] | None = None,
    exits: RankExits | None = None,
) -> subprocess.Popen[bytes]:
    """Bring a lost node back: run its rendered command again, exactly as at launch.

    The new agent joins the rendezvous the survivors wait in (same `--rdzv-id` and endpoint);
    the group re-forms and the ranks resume from the newest complete checkpoint. The caller
    checks that the host answers ssh first (`host_answers`).

    Returns:
        The node's new ssh process; its output is appended to `log_dir/node<R>.log`.
    """
    note = f"llmctl: node {node.node_rank} ({node.host}) lost; running its command again\n"
    with open(Path(log_dir) / f"node{node.node_rank}.log", "a") as log:
        log.write(note)
    print(note, end="", file=sys.stderr if echo is None else echo, flush=True)
    return _start_node(node, log_dir, echo, [] if copiers is None else copiers, exits)


def host_answers(node: NodeCommand, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the node's host accepts an ssh command now (same ssh options as the launch)."""
    proc = _spawn(
        render_host_check(node),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return proc.wait(timeout=timeout_s) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def node_max_restarts(node: NodeCommand) -> int:
    """The `--max-restarts` the node's torchrun was rendered with (pure)."""
    for arg in node.argv:
        if arg.startswith("--max-restarts="):
            return int(arg.split("=", 1)[1])
    return 0


@dataclass(slots=True)
class _Rejoins:
    """Per-node bookkeeping of lost nodes being brought back."""

    used: list[int]
    lost_at: dict[int, float] = field(default_factory=dict)
    next_try: dict[int, float] = field(default_factory=dict)

    def wanted(self, i: int, node: NodeCommand, rc: int | None, any_done: bool) -> bool:
        """Whether a finished ssh session is a lost node to bring back, not a failure."""
        if rc != SSH_LOST or node.node_rank == 0 or any_done:
            return False
        if self.used[i] >= node_max_restarts(node):
            return False
        return time.monotonic() - self.lost_at.setdefault(i, time.monotonic()) < REJOIN_TIMEOUT_S


def _wait_all(
    procs: list[subprocess.Popen[bytes]],
    nodes: list[NodeCommand],
    log_dir: str | Path,
    echo: TextIO | None,
    copiers: list[threading.Thread],
    exits: RankExits | None = None,
) -> int:
    failed_at: float | None = None
    first_rc = 0
    rejoins = _Rejoins(used=[0] * len(procs))
    while any(p.poll() is None for p in procs):
        any_done = any(p.poll() == 0 for p in procs)
        for i, p in enumerate(procs):
            rc = p.poll()
            if failed_at is None and rejoins.wanted(i, nodes[i], rc, any_done):
                if time.monotonic() >= rejoins.next_try.get(i, 0.0):
                    rejoins.next_try[i] = time.monotonic() + REJOIN_RETRY_S
                    if host_answers(nodes[i]):
                        procs[i] = rejoin_node(nodes[i], log_dir, echo, copiers, exits)
                        rejoins.used[i] += 1
                        rejoins.lost_at.pop(i)
                continue
            if rc not in (None, 0) and failed_at is None:
                failed_at, first_rc = time.monotonic(), rc
        if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
            break
        time.sleep(0.2)
    for p in procs:
        rc = p.poll()
        if rc not in (None, 0) and first_rc == 0:
            first_rc = rc
    return first_rc if all(p.poll() is not None for p in procs) else (first_rc or 1)


@dataclass(frozen=True, slots=True)
class NodeCommands:
    """The rendering of an ssh launch: one `NodeCommand` per host, node 0 first."""

    nodes: tuple[NodeCommand, ...]

    def describe(self) -> dict[str, Any]:
        """`nodes` of the --dry-run --json view: argv, env, secret names and ssh argv each."""
        return {
            "nodes": [
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
        }

    def sections(self) -> list[tuple[str, str]]:
        """Each node's ssh command as one shell line."""
        return [(f"node {n.node_rank} on {n.host}", shlex.join(n.ssh_argv)) for n in self.nodes]

    def recorded(self) -> dict[str, Any]:
        """launch.json keeps the nodes."""
        return self.describe()


class TorchrunBackend:
    """`launcher=torchrun`: one torchrun per hostfile host over ssh; this process waits."""

    holds_lock = False  # rank 0 takes the lock on node 0
    port_spread = 0

    def configure(self, cfg: RootConfig) -> RootConfig:
        """No defaults of its own."""
        return cfg

    def render(self, cfg: RootConfig, run_dir: Path, layout: Layout) -> NodeCommands:
        """`render_torchrun_nodes` over `launcher.hostfile`.

        Raises:
            UserError: No hostfile, or one `read_hostfile` refuses; hosts the layout cannot use.
        """
        if not cfg.launcher.hostfile:
            raise UserError("launcher=torchrun needs launcher.hostfile=PATH (one host per line)")
        hosts = drop_excluded(read_hostfile(cfg.launcher.hostfile), run_dir)  # straggler policy
        return NodeCommands(tuple(render_torchrun_nodes(cfg, run_dir, hosts, layout)))

    def check(self, launch: TrainLaunch) -> None:
        """Secrets set here; every host answers ssh and passes the probe (`check_hosts`)."""
        secret_values(tuple(launch.cfg.launcher.secrets))
        check_hosts(launch.cfg, list(_nodes(launch)))

    def execute(
        self, launch: TrainLaunch, *, echo: TextIO | None, lock: RunLock | None, started: Started
    ) -> Outcome:
        """Record the launch, then run every node to its end (`execute_torchrun`)."""
        from llmctl.launch.backend import Outcome

        if launch.cfg.launcher.elastic:  # re-plans on the hosts left (launch.elastic)
            from llmctl.launch.elastic import run_elastic

            return run_elastic(launch, echo=echo, started=started)
        nodes = list(_nodes(launch))
        started({})
        exits = RankExits()
        rc = execute_torchrun(nodes, launch.run_dir / "logs", echo, exits=exits)
        return Outcome(exit_code=rc, reason=exits.reason())

    def status(self, run_dir: Path, record: dict[str, Any]) -> RunStatus:
        """From launch.json's exit code, else whether the launcher or its ranks live."""
        from llmctl.launch.jobs import status_from_record

        return status_from_record(run_dir, record)

    def log_path(self, run_dir: Path, record: dict[str, Any]) -> Path:
        """Node 0's copy: RUN_DIR/logs/node0.log."""
        return run_dir / "logs" / "node0.log"

    def cancel(self, run_dir: Path, record: dict[str, Any]) -> None:
        """SIGTERM to the launcher: its ssh clients end, and each node stops its torchrun."""
        from llmctl.launch.jobs import signal_launcher

        signal_launcher(run_dir, record)


def _nodes(launch: TrainLaunch) -> tuple[NodeCommand, ...]:
    if not isinstance(launch.rendering, NodeCommands):
        raise TypeError(f"launcher=torchrun cannot run a {type(launch.rendering).__name__}")
    return launch.rendering.nodes


if TYPE_CHECKING:  # mypy checks that the class implements the launcher protocol
    _PROTOCOL: type[Backend] = TorchrunBackend
