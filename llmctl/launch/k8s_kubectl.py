"""kubectl for `launcher=kubernetes`: create, get, logs and delete of a run's objects.

Every call goes through `kubectl` with the user's kubeconfig (KUBECONFIG, or ~/.kube/config)
and its current context; nothing here talks to an API server itself. `_kubectl` is the one
place this module runs a process.

- submit: RUN_DIR/k8s.yaml (the rendered text, byte for byte) and `kubectl create -f` it.
- status: `kubectl get <resource> <name> -n <namespace> -o json`; the state is read from the
  object's conditions (`state_of`): TrainJob Complete/Failed/Suspended, JobSet
  Completed/Failed/Suspended, PyTorchJob Succeeded/Failed/Running/Restarting; an object the
  server no longer has reads as GONE.
- logs: `kubectl logs` of node 0's pod (selected by llmctl's run label and the Job completion
  index, or the PyTorchJob master), copied to RUN_DIR/logs/k8s-node0.log; the ranks' own
  RUN_DIR/logs/rank0.log stays on the claim too.
- cancel: `kubectl delete -f RUN_DIR/k8s.yaml --wait=false`: the pods get SIGTERM and their
  terminationGracePeriodSeconds (the ranks checkpoint and exit).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.errors import UserError

if TYPE_CHECKING:
    from llmctl.launch.jobs import RunStatus
    from llmctl.launch.k8s import K8sManifest

KUBECTL_TIMEOUT_S = 60.0
LOG_FILE = "k8s-node0.log"
_DONE = {"Complete": "COMPLETED", "Completed": "COMPLETED", "Succeeded": "COMPLETED",
         "Failed": "FAILED", "Suspended": "SUSPENDED"}  # fmt: skip


def kubectl_path() -> str:
    """Where kubectl is.

    Raises:
        UserError: kubectl is not on PATH.
    """
    path = shutil.which("kubectl")
    if path is None:
        raise UserError(
            "kubectl not found on PATH: launcher=kubernetes submits with kubectl and your "
            "kubeconfig (KUBECONFIG or ~/.kube/config)"
        )
    return path


def _kubectl(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `kubectl ARGS` (the one process this module starts).

    Raises:
        UserError: kubectl missing, or it did not answer within KUBECTL_TIMEOUT_S.
    """
    argv = [kubectl_path(), *args]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, check=False, timeout=KUBECTL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"kubectl {' '.join(args[:2])} did not answer within {KUBECTL_TIMEOUT_S:.0f} s; "
            "check the cluster and your kubeconfig context"
        ) from None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {proc.returncode}"


def submit(manifest: K8sManifest, run_dir: Path) -> str:
    """Write RUN_DIR/k8s.yaml and create its objects.

    Returns:
        The job id, `<namespace>/<name>`.

    Raises:
        UserError: kubectl refused (its last line is included).
    """
    from llmctl.launch.k8s import MANIFEST

    path = run_dir / MANIFEST
    path.write_text(manifest.text)
    proc = _kubectl(["create", "-f", str(path), "-o", "name"])
    if proc.returncode != 0:
        raise UserError(f"kubectl create -f {path} failed: {_last_line(proc)}")
    return f"{manifest.namespace}/{manifest.name}"


def _job(run_dir: Path, record: dict[str, Any]) -> dict[str, str]:
    """launch.json's `k8s` record: api, name, namespace, kind, resource.

    Raises:
        UserError: The record has none (not a Kubernetes launch of this llmctl).
    """
    job = record.get("k8s")
    if not isinstance(job, dict) or not {"name", "namespace", "resource"} <= set(job):
        raise UserError(f"{run_dir}: launch.json names no Kubernetes job (its k8s record)")
    return {str(k): str(v) for k, v in job.items()}


def state_of(obj: dict[str, Any]) -> tuple[str, str | None]:
    """(state, reason) of a TrainJob, JobSet or PyTorchJob from its status (pure)."""
    status = obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    for cond in conditions:
        state = _DONE.get(str(cond.get("type")))
        if state is not None:
            return state, _reason(cond)
    for cond in conditions:
        if cond.get("type") in ("Running", "Restarting"):
            return cond["type"].upper(), _reason(cond)
    return ("RUNNING" if _active(status) else "PENDING"), None


def _reason(cond: dict[str, Any]) -> str | None:
    parts = [str(cond[k]) for k in ("reason", "message") if cond.get(k)]
    return ": ".join(parts) or None


def _active(status: dict[str, Any]) -> bool:
    """Whether any child Job or replica has a running pod."""
    children = [*(status.get("jobsStatus") or []), *(status.get("replicatedJobsStatus") or [])]
    children += list((status.get("replicaStatuses") or {}).values())
    return any(int(c.get("active") or 0) > 0 for c in children)


def job_status(run_dir: Path, record: dict[str, Any]) -> RunStatus:
    """Where the run's job stands, from `kubectl get -o json`.

    Raises:
        UserError: kubectl failed for another reason than a job the server no longer has.
    """
    from llmctl.launch.jobs import RunStatus, last_metrics, total_steps

    job = _job(run_dir, record)
    proc = _kubectl(["get", job["resource"], job["name"], "-n", job["namespace"], "-o", "json"])
    if proc.returncode != 0 and "NotFound" not in proc.stderr:
        raise UserError(f"kubectl get {job['resource']} {job['name']} failed: {_last_line(proc)}")
    obj: dict[str, Any] = {}
    state: str = "GONE"
    reason: str | None = "the server has no such object (deleted?)"
    if proc.returncode == 0:
        obj = json.loads(proc.stdout)
        state, reason = state_of(obj)
    status = obj.get("status") or {}
    if (run_dir / "logs" / LOG_FILE).is_file():
        fetch_logs(run_dir, record)  # keep `llmctl logs --follow` current
    step, loss = last_metrics(run_dir)
    restarts = status.get("restarts")
    return RunStatus(
        run_dir=str(run_dir),
        kind="kubernetes",
        job_id=f"{job['namespace']}/{job['name']}",
        state=state,
        reason=reason,
        restarts=int(restarts) if restarts is not None else None,
        elapsed=status.get("startTime"),
        step=step,
        loss=loss,
        total_steps=total_steps(run_dir),
    )


def leader_selector(job: dict[str, str]) -> str:
    """Label selector of node 0's pod (pure)."""
    from llmctl.launch.k8s import RUN_LABEL

    if job.get("api") == "pytorchjob":
        return f"{RUN_LABEL}={job['name']},training.kubeflow.org/replica-type=master"
    return f"{RUN_LABEL}={job['name']},batch.kubernetes.io/job-completion-index=0"


def fetch_logs(run_dir: Path, record: dict[str, Any]) -> Path:
    """Copy node 0's pod log to RUN_DIR/logs/k8s-node0.log (replaced whole).

    Returns:
        That file; when no pod answers (not started, or gone), the last copy if there is one,
        else the ranks' own RUN_DIR/logs/rank0.log.
    """
    job = _job(run_dir, record)
    logs = run_dir / "logs"
    out = logs / LOG_FILE
    args = ["logs", "-n", job["namespace"], "-l", leader_selector(job), "--tail=-1"]
    proc = _kubectl(args)
    if proc.returncode == 0 and proc.stdout:
        logs.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{LOG_FILE}.tmp")
        tmp.write_text(proc.stdout)
        os.replace(tmp, out)
    return out if out.is_file() else logs / "rank0.log"


def delete(run_dir: Path, record: dict[str, Any]) -> None:
    """Delete the run's objects; the pods get SIGTERM and their grace period to checkpoint.

    Raises:
        UserError: kubectl refused (a job already gone is not an error).
    """
    from llmctl.launch.k8s import MANIFEST

    job = _job(run_dir, record)
    manifest = run_dir / MANIFEST
    if manifest.is_file():
        args = ["delete", "-f", str(manifest), "--wait=false", "--ignore-not-found"]
    else:
        args = ["delete", job["resource"], job["name"], "-n", job["namespace"], "--wait=false",
                "--ignore-not-found"]  # fmt: skip
    proc = _kubectl(args)
    if proc.returncode != 0:
        raise UserError(f"kubectl delete of {job['name']} failed: {_last_line(proc)}")
