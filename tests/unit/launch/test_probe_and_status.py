"""Pure judgements: a host probe's findings (loopback traps) and scontrol's one-line records."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.launch.jobs import RunStatus
from llmctl.launch.slurm import parse_scontrol
from llmctl.launch.torchrun import check_probe

PY = "/venv/bin/python"


def _probe(host: str = "n1", rdzv: str = "10.0.0.1", self_addr: str = "10.0.0.2") -> str:
    return f"host={host}\nrdzv={rdzv}\nself={self_addr}\npython=ok\n"


def test_healthy_probe_passes() -> None:
    check_probe("n1", "n0", _probe(), PY, multi_node=True, env={})


@pytest.mark.parametrize(
    ("output", "needle"),
    [
        (_probe(rdzv="127.0.1.1"), "rendezvous host n0 resolves to 127.0.1.1 (loopback) on n1"),
        (_probe(self_addr="127.0.1.1"), "host n1 calls itself 'n1', which resolves to 127.0.1.1"),
        (_probe(rdzv=""), "rendezvous host n0 does not resolve on n1"),
        (_probe().replace("python=ok", "python=missing"), f"{PY} not found on host n1"),
    ],
)
def test_probe_findings_are_explained(output: str, needle: str) -> None:
    with pytest.raises(UserError) as err:
        check_probe("n1", "n0", output, PY, multi_node=True, env={})
    assert needle in err.value.message


def test_loopback_is_fine_on_one_node_and_with_an_interface_set() -> None:
    check_probe("n0", "n0", _probe(rdzv="127.0.0.1", self_addr="127.0.0.1"), PY, False, {})
    check_probe("n1", "n0", _probe(self_addr="127.0.1.1"), PY, True, {"GLOO_SOCKET_IFNAME": "ib0"})


def test_parse_scontrol_keeps_values_with_spaces() -> None:
    line = (
        "JobId=12 JobName=my job UserId=root(0) JobState=RUNNING Reason=None Restarts=1 "
        "RunTime=00:00:05 NodeList=vm WorkDir=/tmp/a b StdOut=/tmp/a b/slurm-12.out"
    )
    rec = parse_scontrol(line)
    assert rec["JobName"] == "my job" and rec["JobState"] == "RUNNING"
    assert rec["WorkDir"] == "/tmp/a b" and rec["Restarts"] == "1"


def test_terminal_states() -> None:
    assert RunStatus(run_dir=None, kind="slurm", state="COMPLETED").finished
    assert not RunStatus(run_dir=None, kind="slurm", state="PENDING").finished


def test_state_line_says_why_a_finished_run_ended() -> None:
    from llmctl.cli.jobs import state_text

    def line(**kw: str) -> str:
        return state_text(RunStatus(run_dir="r", kind="slurm", **kw))  # type: ignore[arg-type]

    assert line(state="GONE", exit_code="3:0") == (
        "GONE (SLURM forgot the job; exit code 3:0 recorded in launch.json)"
    )
    assert line(state="GONE") == "GONE"
    assert line(state="PENDING", reason="Resources") == "PENDING (Resources)"
    assert line(state="FAILED", exit_code="1") == "FAILED (exit code 1)"
    assert line(state="COMPLETED", exit_code="0:0") == "COMPLETED"


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["logs"]])
def test_cut_short_launch_record_is_one_line_naming_it(
    tmp_path: Path, command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The final record is written in place on a full disk; a crash there leaves a cut JSON.
    from typer.testing import CliRunner

    from llmctl.cli.main import app
    from llmctl.launch.api import write_launch

    monkeypatch.chdir(tmp_path)  # a short path: the error box would cut a long one
    run = Path("run")
    run.mkdir()
    (run / "config.yaml").write_text("recipe: tiny_cpu\n")
    write_launch(run, {"kind": "local", "run_dir": str(tmp_path / run), "pid": 1})
    record = run / "launch.json"
    record.write_text(record.read_text()[:20])
    res = CliRunner().invoke(app, [*command[:1], "run", *command[1:]])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert f"{record} is not valid JSON" in " ".join(res.output.replace("│", " ").split())


def _status_with_launcher(run_dir: Path, **record: object) -> str:
    """`llmctl status --json` state of a run whose launcher record names `record`."""
    import json

    from typer.testing import CliRunner

    from llmctl.cli.main import app
    from llmctl.launch.api import write_launch

    (run_dir / "config.yaml").write_text("recipe: tiny_cpu\n")
    write_launch(run_dir, {"kind": "local", "run_dir": str(run_dir), **record})
    res = CliRunner().invoke(app, ["status", str(run_dir), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["state"]


def test_launcher_killed_without_a_record_is_not_running_under_a_reused_pid(
    tmp_path: Path,
) -> None:
    # kill -9 of `llmctl train` records no exit code; its pid then belongs to a newer process.
    import os
    import socket
    import subprocess
    import time

    newer = subprocess.Popen(["sleep", "60"])
    try:
        before = time.time() - 30  # the dead launcher started before the newer process
        state = _status_with_launcher(tmp_path, started=before, pid=newer.pid)
        assert state == "EXITED"
        # A live pid recorded on another host (a shared run directory) is not ours to judge.
        other = tmp_path / "other"
        other.mkdir()
        now = time.time()
        assert _status_with_launcher(other, started=now, pid=os.getpid(), host="x-9") == "EXITED"
    finally:
        newer.kill()
        newer.wait()
    # The launcher itself (started before its record) is running.
    mine = tmp_path / "mine"
    mine.mkdir()
    state = _status_with_launcher(
        mine, started=time.time(), pid=os.getpid(), host=socket.gethostname()
    )
    assert state == "RUNNING"


@pytest.mark.parametrize("command", ["status", "logs"])
def test_slurm_run_without_a_job_id_is_refused_not_another_jobs_state(
    tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `scontrol show job ""` lists every job: status printed some other job's state.
    from typer.testing import CliRunner

    from llmctl.cli.main import app
    from llmctl.launch.api import write_launch

    monkeypatch.chdir(tmp_path)  # a short path: the error box would cut a long one
    run = Path("run")
    run.mkdir()
    (run / "config.yaml").write_text("recipe: tiny_cpu\n")
    write_launch(run, {"kind": "slurm", "run_dir": str(tmp_path / run)})
    res = CliRunner().invoke(app, [command, "run"])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.replace("│", " ").split())
    assert "run: no SLURM job id in launch.json or slurm_job_id" in text
