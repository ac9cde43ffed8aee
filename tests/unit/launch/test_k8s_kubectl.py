"""`launcher=kubernetes` submit, status, logs and cancel through kubectl, against a FAKE kubectl.

No Kubernetes API server exists on this machine kind. The kubectl on PATH here is a script of
this test: it records its argv and answers with the hand-written responses of
tests/fixtures/k8s/responses (README there: shapes from the Trainer v2.3.0 CRD and kubectl's
documented output, not recordings of a live server). What is tested is llmctl's side: the
exact kubectl calls, the files written to the run directory, how answers become a RunStatus,
and that no secret value reaches any file.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_support import validate_crd
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.errors import UserError
from llmctl.launch.jobs import cancel_run, follow_logs, run_status

RESPONSES = Path(__file__).resolve().parents[2] / "fixtures" / "k8s" / "responses"
SECRET = "t0ken-v4lue-never-written"
FAKE = f"""#!{sys.executable}
# FAKE kubectl of test_k8s_kubectl.py: records argv, answers from $FAKE_KUBECTL_DIR/<verb>.json
import json, os, shutil, sys
d = os.environ["FAKE_KUBECTL_DIR"]
with open(os.path.join(d, "argv.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
verb = sys.argv[1]
if verb == "create":  # keep what would reach the server
    shutil.copy(sys.argv[sys.argv.index("-f") + 1], os.path.join(d, "applied.yaml"))
r = json.load(open(os.path.join(d, verb + ".json")))
sys.stdout.write(r["stdout"]); sys.stderr.write(r["stderr"]); sys.exit(r["rc"])
"""


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake kubectl first on PATH; returns its directory (argv.jsonl, <verb>.json)."""
    d = tmp_path / "fake-kubectl"
    d.mkdir()
    script = d / "kubectl"
    script.write_text(FAKE)
    script.chmod(0o755)
    for name in ("create", "logs", "delete"):
        shutil.copy(RESPONSES / f"{name}.json", d / f"{name}.json")
    monkeypatch.setenv("PATH", f"{d}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_DIR", str(d))
    return d


def _calls(d: Path) -> list[list[str]]:
    path = d / "argv.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _answer(d: Path, scenario: str) -> dict[str, Any]:
    shutil.copy(RESPONSES / f"{scenario}.json", d / "get.json")
    return json.loads((RESPONSES / f"{scenario}.json").read_text())


def _toy_data(tmp_path: Path) -> str:
    import numpy as np

    from llmctl.data.indexed import ShardWriter

    prefix = tmp_path / "data" / "toy"
    prefix.parent.mkdir(parents=True)
    docs = [np.arange(s, s + 80) % 4096 for s in range(0, 4000, 40)]
    writer = ShardWriter(prefix, np.uint16)
    writer.add_documents(np.concatenate(docs), np.array([len(d) for d in docs]))
    writer.close()
    return str(prefix)


def _train_args(tmp_path: Path) -> list[str]:
    runs = tmp_path / "runs"
    return ["train", "recipe=tiny_cpu", "launcher=kubernetes", "--nodes", "2", "--dp", "2",
            "launcher.k8s.image=registry.example.com/llmctl:0.1", "launcher.k8s.pvc=runs",
            f"launcher.k8s.pvc_mount={runs}", f"train.run_dir={runs / 'k8s-run'}",
            "launcher.secrets=[LLMCTL_TEST_TOKEN]", "launcher.k8s.secret_name=llmctl-secrets",
            f"data.prefixes=[{_toy_data(tmp_path)}]"]  # fmt: skip


def test_submit_status_logs_cancel_through_kubectl(
    kubectl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMCTL_TEST_TOKEN", SECRET)
    runner = CliRunner()
    args = _train_args(tmp_path)
    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    run = tmp_path / "runs" / "k8s-run"
    assert "submitted Kubernetes job default/k8s-run" in res.output
    assert _calls(kubectl) == [["create", "-f", str(run / "k8s.yaml"), "-o", "name"]]
    text = (run / "k8s.yaml").read_text()
    assert (kubectl / "applied.yaml").read_text() == text
    head = "# --- kubernetes objects (k8s.yaml, applied with kubectl create -f) ---\n"
    section = dry.output[dry.output.index(head) + len(head) :]
    assert section.startswith(text)  # --dry-run printed exactly what was applied
    record = json.loads((run / "launch.json").read_text())
    assert record["kind"] == "kubernetes" and record["job_id"] == "default/k8s-run"
    assert record["k8s"]["resource"] == "trainjobs.trainer.kubeflow.org"

    get = ["get", "trainjobs.trainer.kubeflow.org", "k8s-run", "-n", "default", "-o", "json"]
    for scenario, state in [("get-running", "RUNNING"), ("get-complete", "COMPLETED"),
                            ("get-failed", "FAILED"), ("get-notfound", "GONE")]:  # fmt: skip
        answer = _answer(kubectl, scenario)
        if answer["rc"] == 0:
            validate_crd(json.loads(answer["stdout"]), "trainer-v2.3.0")  # a real TrainJob shape
        out = runner.invoke(app, ["status", str(run), "--json"])
        assert out.exit_code == 0, out.output
        status = json.loads(out.output)
        assert (status["state"], status["kind"], status["job_id"]) == (
            state, "kubernetes", "default/k8s-run")  # fmt: skip
        assert _calls(kubectl)[-1] == get
    assert run_status(str(run)).finished  # GONE
    _answer(kubectl, "get-failed")
    assert run_status(str(run)).reason == (
        "ReachedMaxRestarts: jobset failed due to reaching max number of restarts"
    )
    _answer(kubectl, "get-forbidden")
    with pytest.raises(UserError, match=r"kubectl get .* failed: Error from server \(Forbidden\)"):
        run_status(str(run))

    logs = runner.invoke(app, ["logs", str(run)])
    assert logs.exit_code == 0, logs.output
    assert logs.output == json.loads((RESPONSES / "logs.json").read_text())["stdout"]
    leader = "llmctl.dev/run=k8s-run,batch.kubernetes.io/job-completion-index=0"
    assert _calls(kubectl)[-1] == ["logs", "-n", "default", "-l", leader, "--tail=-1"]
    _answer(kubectl, "get-complete")
    seen: list[str] = []
    final = follow_logs(run, seen.append, follow=True, poll_s=0.01, timeout_s=5)
    assert final is not None and final.state == "COMPLETED" and "step 2 loss" in "".join(seen)

    cancel_run(run)
    assert _calls(kubectl)[-1] == ["delete", "-f", str(run / "k8s.yaml"), "--wait=false",
                                   "--ignore-not-found"]  # fmt: skip

    for path in [*run.rglob("*"), *kubectl.rglob("*")]:  # no secret value in any file
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    objects = list(yaml.safe_load_all(text))
    env = objects[-1]["spec"]["trainer"]["env"]
    assert {"name": "LLMCTL_TEST_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "llmctl-secrets", "key": "LLMCTL_TEST_TOKEN"}}} in env  # fmt: skip


def test_refused_create_is_one_line_and_no_job_is_recorded(kubectl: Path, tmp_path: Path) -> None:
    (kubectl / "create.json").write_text(json.dumps({"rc": 1, "stdout": "", "stderr": (
        'Error from server (NotFound): error when creating "k8s.yaml": the server could not '
        'find the requested resource (post trainjobs.trainer.kubeflow.org)\n')}))  # fmt: skip
    res = CliRunner().invoke(app, _train_args(tmp_path))
    assert res.exit_code == 2
    flat = " ".join(res.output.split())
    assert "kubectl create -f" in flat and "could not find the requested resource" in flat
    run = tmp_path / "runs" / "k8s-run"
    assert not (run / "launch.json").exists()  # as when sbatch refuses: no job recorded
    with pytest.raises(UserError, match="was never launched"):
        run_status(str(run))


def test_no_kubectl_is_refused_before_the_run_dir_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    res = CliRunner().invoke(app, _train_args(tmp_path))
    assert res.exit_code == 2
    assert "kubectl not found on PATH" in " ".join(res.output.split())
    assert not (tmp_path / "runs" / "k8s-run").exists()
