"""`launcher=kubernetes`: the planned job as a Kubeflow Trainer TrainJob, a JobSet or a PyTorchJob.

Rendering (pure) gives the objects `kubectl create -f` applies, as one YAML text that
`--dry-run` prints byte for byte and `execute` writes to RUN_DIR/k8s.yaml before submitting it.
One pod per node; every pod runs the rank entry point under torchrun, as the other launchers do:

    python -m llmctl.launch.node run --forward-signals -- \\
      python -m torch.distributed.run --nnodes=$(PET_NNODES) ... -m llmctl.train.entry RUN_DIR

The kubelet expands `$(VAR)` in a container's command from the container's environment (every
other `$` of a rendered value is doubled, so paths and `launcher.env` values stay verbatim). The
PET_* variables come from the controller: Kubeflow Trainer's torch runtime injects PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion index), PET_MASTER_ADDR
(`<job>-node-0-0.<job>`, the headless-service name of node 0) and PET_MASTER_PORT (29500);
for a JobSet llmctl renders the same five itself; the training-operator sets PET_NNODES,
PET_NPROC_PER_NODE, PET_NODE_RANK, MASTER_ADDR and MASTER_PORT of a PyTorchJob.

Supported versions (the CRDs in tests/fixtures/k8s/crds validate every rendered object):
Kubeflow Trainer v2.2 and v2.3 (`trainer.kubeflow.org/v1alpha1`; v2.0/v2.1 had
podSpecOverrides/podTemplateOverrides instead of runtimePatches and are not rendered), JobSet
v0.12 (`jobset.x-k8s.io/v1alpha2`), Kubeflow training-operator v1.9 (`kubeflow.org/v1`).

Restarts: a TrainJob without `launcher.k8s.runtime_ref` comes with a TrainingRuntime of its
own whose JobSet restarts the whole job (`failurePolicy.maxRestarts`, BlockingRecreate: every
old pod is gone before new ones start, so two rank 0s never share the run directory); a
preemption (pod condition DisruptionTarget) restarts it without using up the budget. The
restarted ranks resume from the newest complete checkpoint (automatic in a run directory that
has one). `terminationGracePeriodSeconds` covers the planned checkpoint save (`grace_period`).

Placement (`plan_placement`): pods of one TP (or EP) group share an NVLink domain (the node
label `launcher.k8s.nvlink_label`, e.g. GB200's `nvidia.com/gpu.clique`) and pods spread one
per node. `KubernetesBackend` is this launcher's `launch.backend.Backend`; kubectl calls are in
`launch.k8s_kubectl`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from llmctl.errors import UserError
from llmctl.launch.common import (
    NODE_MODULE,
    check_env_names,
    entry_args,
    launch_env,
    launch_shape,
    layout_of,
    run_name,
    torchrun_prefix,
)

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig
    from llmctl.launch.backend import Backend, Outcome, Started, TrainLaunch
    from llmctl.launch.common import Shape
    from llmctl.launch.jobs import RunStatus
    from llmctl.plan import Layout
    from llmctl.run.lock import RunLock

MANIFEST = "k8s.yaml"
"""The rendered objects as submitted, under the run directory."""
RUN_LABEL = "llmctl.dev/run"
"""Label on every object and pod of a run (pod affinity and spread select on it)."""
TRAINER_PORT = 29500  # Kubeflow Trainer's torch runtime: PET_MASTER_PORT, always
NAME_MAX = 40  # `<name>-node-0-0` and JobSet's longer child names stay DNS labels
EXIT_MARGIN_S = 30  # after the save: torchrun stops the other workers (it waits up to 30 s)
HOSTNAME_LABEL = "kubernetes.io/hostname"
PYTHON = "python"  # the image's interpreter unless launcher.python names one
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_RESOURCE_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

API_VERSIONS = {
    "trainjob": "trainer.kubeflow.org/v1alpha1",
    "jobset": "jobset.x-k8s.io/v1alpha2",
    "pytorchjob": "kubeflow.org/v1",
}
RESOURCES = {"trainjob": "trainjobs.trainer.kubeflow.org", "jobset": "jobsets.jobset.x-k8s.io",
             "pytorchjob": "pytorchjobs.kubeflow.org"}  # fmt: skip
"""`kubectl get` resource of the main object of each api."""


def _dns_label(field_name: str, value: str, max_len: int = 63) -> str:
    if len(value) > max_len or not _LABEL_RE.match(value):
        raise UserError(
            f"{field_name}={value!r} is not a Kubernetes name: lower-case letters, digits and "
            f"'-', starting and ending with a letter or digit, at most {max_len} characters"
        )
    return value


def job_name(cfg: RootConfig, run_dir: str | Path) -> str:
    """The objects' name: `launcher.k8s.job_name` (checked), else from the run directory.

    A name from the run directory is made a DNS label: lower-cased, runs of other characters
    become '-', and a name cut to NAME_MAX keeps a hash of the whole so two runs stay apart.

    Raises:
        UserError: An explicit job_name that is not a DNS label of at most NAME_MAX chars.
    """
    explicit = cfg.launcher.k8s.job_name
    if explicit:
        return _dns_label("launcher.k8s.job_name", str(explicit), NAME_MAX)
    base = re.sub(r"[^a-z0-9]+", "-", run_name(run_dir).lower()).strip("-") or "llmctl"
    if not base[0].isalpha():
        base = "r-" + base
    if len(base) > NAME_MAX:
        digest = hashlib.sha256(base.encode()).hexdigest()[:8]
        base = base[: NAME_MAX - 9].rstrip("-") + "-" + digest
    return base


@dataclass(frozen=True, slots=True, kw_only=True)
class Grace:
    """terminationGracePeriodSeconds and how it was derived."""

    seconds: int
    step_s: float
    save_s: float
    checkpoint_gib_per_pod: float

    def explain(self, floor_s: int) -> str:
        """One line: the formula with its numbers."""
        return (
            f"terminationGracePeriodSeconds={self.seconds}: max({floor_s}, ceil(step "
            f"{self.step_s:.3g} s + save {self.save_s:.3g} s) + {EXIT_MARGIN_S} s); save = "
            f"{self.checkpoint_gib_per_pod:.3g} GiB per pod (weights + optimizer state of its "
            "ranks, planned) at launcher.k8s.checkpoint_write_gb_s"
        )


def grace_period(cfg: RootConfig, layout: Layout, nproc: int) -> Grace:
    """The grace period a preempted pod needs to finish its step and save its checkpoint.

    From the planner's prediction for `layout`: the step time, and the checkpoint of a pod
    (weights + optimizer state per rank, times its ranks) written at
    `launcher.k8s.checkpoint_write_gb_s`; plus EXIT_MARGIN_S for the exit (torchrun stops the
    other workers once one has exited, waiting up to 30 s), with `launcher.k8s.min_grace_s` as
    the floor. The pod's wrapper sends the kubelet's SIGTERM to the ranks themselves
    (`launch.node --forward-signals`), so torchrun's 30 s limit does not cut the save short.
    """
    from llmctl.plan.search import evaluate
    from llmctl.run.planning import plan_input

    ev = evaluate(plan_input(cfg), layout)
    gib = (ev.memory.weights_gib + ev.memory.optimizer_gib) * nproc
    rate = float(cfg.launcher.k8s.checkpoint_write_gb_s)
    if rate <= 0:
        raise UserError(f"launcher.k8s.checkpoint_write_gb_s must be > 0, got {rate}")
    save_s = gib * 2**30 / (rate * 1e9)
    step_s = float(ev.time.total_s)
    seconds = max(int(cfg.launcher.k8s.min_grace_s), math.ceil(step_s + save_s) + EXIT_MARGIN_S)
    return Grace(seconds=seconds, step_s=step_s, save_s=save_s, checkpoint_gib_per_pod=gib)


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the pods go and why (pure data; `lines` is the --dry-run explanation)."""

    affinity: dict[str, Any] | None = None
    spread: list[dict[str, Any]] = field(default_factory=list)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    lines: tuple[str, ...] = ()


def nvlink_group_ranks(layout: Layout) -> int:
    """Ranks that the plan puts on NVLink together: a TP group, or an EP group of experts
    (megatron's tp-cp-ep-dp-pp order makes either a run of consecutive ranks when CP is 1)."""
    group = layout.tp
    if layout.ep > 1 and layout.cp == 1:
        group = max(group, (layout.etp or layout.tp) * layout.ep)
    return group


def plan_placement(cfg: RootConfig, layout: Layout, shape: Shape, name: str) -> Placement:
    """Pod affinity, spread and Kueue annotations from the layout and the cluster (pure).

    Raises:
        UserError: TP/EP groups span pods, the job is larger than one NVLink domain, and no
            Kueue topology-aware scheduling is configured (nothing could keep each group on one
            domain).
    """
    k8s = cfg.launcher.k8s
    select = {"labelSelector": {"matchLabels": {RUN_LABEL: name}}}
    nproc, pods = shape.nproc_per_node, shape.num_nodes
    group = nvlink_group_ranks(layout)
    domain = int(cfg.cluster.nvlink_domain_size)
    pods_per_domain = max(1, domain // max(1, cfg.cluster.gpus_per_node))
    group_pods = math.ceil(group / nproc)
    lines = [
        f"{pods} pod(s) x {nproc} rank(s); NVLink group (TP{layout.tp}"
        + (f", EP{layout.ep}" if layout.ep > 1 else "")
        + f") = {group} rank(s) = {group_pods} pod(s); an NVLink domain holds "
        f"{pods_per_domain} node(s) ({domain} GPUs, label {k8s.nvlink_label})"
    ]
    affinity: dict[str, Any] | None = None
    annotations: dict[str, str] = {}
    if str(cfg.cluster.device) != "cuda":
        lines.append("CPU cluster: no NVLink domain to respect")
    elif group_pods <= 1:
        lines.append("each NVLink group lies inside one pod (one node): no pod affinity needed")
    elif group > domain:
        lines.append(
            f"the NVLink group ({group} ranks) is larger than a domain ({domain}): the plan "
            "lets it cross nodes (parallel.allow_tp_outside_nvlink); no NVLink constraint"
        )
    elif pods <= pods_per_domain:
        affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {**select, "topologyKey": str(k8s.nvlink_label)}]}}  # fmt: skip
        lines.append(
            f"the whole job ({pods} pods) fits one NVLink domain: required pod affinity on "
            f"{k8s.nvlink_label} keeps every pod, so every TP/EP group, on one domain"
        )
    elif k8s.kueue_queue:
        annotations["kueue.x-k8s.io/podset-slice-required-topology"] = str(k8s.nvlink_label)
        annotations["kueue.x-k8s.io/podset-slice-size"] = str(group_pods)
        lines.append(
            f"Kueue TAS slices: every {group_pods} consecutive pods (one NVLink group) on one "
            f"{k8s.nvlink_label} domain"
        )
    else:
        raise UserError(
            f"each TP/EP group spans {group_pods} pods and the job ({pods} pods) is larger than "
            f"one NVLink domain ({pods_per_domain} nodes): set launcher.k8s.kueue_queue (Kueue "
            "topology-aware scheduling keeps each group on one domain) or shrink the job"
        )
    if k8s.kueue_queue and k8s.kueue_topology:
        kind = "required" if k8s.kueue_topology_required else "preferred"
        annotations[f"kueue.x-k8s.io/podset-{kind}-topology"] = str(k8s.kueue_topology)
        lines.append(f"Kueue TAS: the whole job {kind} on one {k8s.kueue_topology} domain")
    spread: list[dict[str, Any]] = []
    if pods > 1:
        spread = [{"maxSkew": 1, "topologyKey": HOSTNAME_LABEL,
                   "whenUnsatisfiable": "DoNotSchedule", **select}]  # fmt: skip
        lines.append(
            f"PP/DP across pods as planned: one pod per node (topology spread on {HOSTNAME_LABEL})"
        )
    if k8s.kueue_queue:
        lines.append(f"Kueue queue {k8s.kueue_queue} (label kueue.x-k8s.io/queue-name)")
    return Placement(
        affinity=affinity, spread=spread, pod_annotations=annotations, lines=tuple(lines)
    )


def literal(text: str) -> str:
    """`text` as a command argument or env value the kubelet leaves as it is: it expands
    `$(VAR)` and reduces `$$` to `$`, so every `$` is doubled (pure)."""
    return text.replace("$", "$$")


def _master(api: str) -> tuple[str, str]:
    """The env variables holding the rendezvous host and port in a pod of `api`."""
    if api == "pytorchjob":
        return "MASTER_ADDR", "MASTER_PORT"
    return "PET_MASTER_ADDR", "PET_MASTER_PORT"


def container_command(cfg: RootConfig, run_dir: str | Path, api: str) -> list[str]:
    """The container's command: the node wrapper around torchrun, PET_* read by the kubelet's
    `$(VAR)` expansion (pure)."""
    python = str(cfg.launcher.python or PYTHON)
    addr, port = _master(api)
    return [
        python,
        "-m",
        NODE_MODULE,
        "run",
        "--forward-signals",
        "--",
        *torchrun_prefix(python),
        "--nnodes=$(PET_NNODES)",
        "--nproc-per-node=$(PET_NPROC_PER_NODE)",
        "--node-rank=$(PET_NODE_RANK)",
        f"--master-addr=$({addr})",
        f"--master-port=$({port})",
        f"--max-restarts={int(cfg.launcher.max_restarts)}",
        *(literal(a) for a in entry_args(run_dir)),
    ]


def pod_env(cfg: RootConfig, shape: Shape) -> list[dict[str, Any]]:
    """The container's env: the launch environment, NCCL settings, secrets by reference.

    Raises:
        UserError: launcher.secrets without launcher.k8s.secret_name, or a reserved PET_* name.
    """
    check_env_names(cfg)
    k8s = cfg.launcher.k8s
    env = launch_env(cfg, shape)
    if str(cfg.cluster.device) == "cuda":
        nccl = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "0" if k8s.rdma_resource else "1"}
        if k8s.nccl_ib_hca:
            nccl["NCCL_IB_HCA"] = str(k8s.nccl_ib_hca)
        if cfg.cluster.nvlink_domain_size > cfg.cluster.gpus_per_node:
            nccl["NCCL_MNNVL_ENABLE"] = "1"  # NVLink across nodes (GB200 NVL72)
        env = {**nccl, **env}  # launcher.env (inside env) wins
    reserved = sorted(n for n in env if n.startswith("PET_"))
    if reserved:
        raise UserError(f"launcher.env: {reserved[0]} is set by the Kubernetes controller")
    out: list[dict[str, Any]] = [{"name": k, "value": literal(v)} for k, v in env.items()]
    secrets = [str(s) for s in cfg.launcher.secrets]
    if secrets and not k8s.secret_name:
        raise UserError(
            "launcher.secrets on Kubernetes come from a Secret: set launcher.k8s.secret_name "
            "(a Secret with one key per name)"
        )
    for name in secrets:
        ref = {
            "name": _dns_label("launcher.k8s.secret_name", str(k8s.secret_name), 253),
            "key": name,
        }
        out.append({"name": name, "valueFrom": {"secretKeyRef": ref}})
    return out


def _jobset_pet_env(name: str, shape: Shape, port: int) -> list[dict[str, Any]]:
    """The PET_* variables Trainer's torch runtime would inject, for a plain JobSet."""
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return [
        {"name": "PET_NNODES", "value": str(shape.num_nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(shape.nproc_per_node)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(port)},
    ]


def _quantity(field_name: str, value: str) -> str:
    if not _QUANTITY_RE.match(value):
        raise UserError(f"{field_name}={value!r} is not a Kubernetes quantity (e.g. 64Gi)")
    return value


def _resource_name(field_name: str, value: str) -> str:
    if not _RESOURCE_RE.match(value) or len(value) > 253:
        raise UserError(f"{field_name}={value!r} is not a resource name (e.g. nvidia.com/gpu)")
    return value


def pod_resources(cfg: RootConfig, shape: Shape) -> dict[str, Any]:
    """Requests and limits of one pod: its GPUs and RDMA devices, or its CPUs (pure)."""
    k8s = cfg.launcher.k8s
    if str(cfg.cluster.device) != "cuda":
        cpus = str(cfg.cluster.cpu_cores or shape.nproc_per_node)
        return {"requests": {"cpu": cpus}, "limits": {"cpu": cpus}}
    gpu = _resource_name("launcher.k8s.gpu_resource", str(k8s.gpu_resource))
    limits = {gpu: str(shape.nproc_per_node)}
    if k8s.rdma_resource:
        if k8s.rdma_per_node < 1:
            raise UserError(f"launcher.k8s.rdma_per_node must be >= 1, got {k8s.rdma_per_node}")
        rdma = _resource_name("launcher.k8s.rdma_resource", str(k8s.rdma_resource))
        limits[rdma] = str(k8s.rdma_per_node)
    return {"requests": dict(limits), "limits": limits}


def check_run_dir(cfg: RootConfig, run_dir: str | Path) -> None:
    """The run directory lies on the claim the pods mount, at the same path.

    Raises:
        UserError: No launcher.k8s.pvc, or a run directory outside launcher.k8s.pvc_mount.
    """
    k8s = cfg.launcher.k8s
    if not k8s.pvc:
        raise UserError(
            "launcher=kubernetes needs launcher.k8s.pvc: a PersistentVolumeClaim holding the run "
            "directory, mounted at launcher.k8s.pvc_mount in the pods and here"
        )
    _dns_label("launcher.k8s.pvc", str(k8s.pvc), 253)
    mount = Path(str(k8s.pvc_mount))
    if any(c in str(run_dir) for c in "\n\r\0"):
        raise UserError(f"train.run_dir={str(run_dir)!r} contains a line break or NUL")
    if not mount.is_absolute() or not Path(run_dir).is_relative_to(mount):
        raise UserError(
            f"train.run_dir={run_dir} is not under launcher.k8s.pvc_mount={mount}: the pods "
            "see the run directory only on the claim; put it under the mount"
        )


def _volumes(cfg: RootConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    k8s = cfg.launcher.k8s
    shm = _quantity("launcher.k8s.shm_size", str(k8s.shm_size))
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        {"name": "run", "persistentVolumeClaim": {"claimName": str(k8s.pvc)}},
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "run", "mountPath": str(k8s.pvc_mount)},
    ]
    return volumes, mounts


@dataclass(frozen=True, slots=True, kw_only=True)
class PodParts:
    """What every rendering puts into the pods of a run (pure data)."""

    name: str
    shape: Shape
    command: list[str]
    env: list[dict[str, Any]]
    env_from: list[dict[str, Any]]
    resources: dict[str, Any]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    grace: Grace
    placement: Placement
    labels: dict[str, str]

    def pod_spec(self, cfg: RootConfig, container: dict[str, Any]) -> dict[str, Any]:
        """A pod spec around `container`, with the run's volumes, placement and grace."""
        k8s = cfg.launcher.k8s
        spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
        if k8s.service_account:
            spec["serviceAccountName"] = _dns_label(
                "launcher.k8s.service_account", str(k8s.service_account), 253
            )
        spec["terminationGracePeriodSeconds"] = self.grace.seconds
        if k8s.node_selector:
            spec["nodeSelector"] = {str(k): str(v) for k, v in k8s.node_selector.items()}
        if self.placement.affinity:
            spec["affinity"] = self.placement.affinity
        if self.placement.spread:
            spec["topologySpreadConstraints"] = self.placement.spread
        spec["volumes"] = self.volumes
        return spec

    def container(self, cfg: RootConfig, name: str, *, pet: list[dict[str, Any]]) -> dict[str, Any]:
        """The full training container (JobSet, PyTorchJob, the job's own TrainingRuntime)."""
        c: dict[str, Any] = {
            "name": name,
            "image": image_of(cfg),
            "command": self.command,
            "env": [*pet, *self.env],
        }
        if self.env_from:
            c["envFrom"] = self.env_from
        c["resources"] = self.resources
        c["volumeMounts"] = self.mounts
        return c

    def template_metadata(self) -> dict[str, Any]:
        """Pod template metadata: the run label, Kueue TAS annotations."""
        meta: dict[str, Any] = {"labels": dict(self.labels)}
        if self.placement.pod_annotations:
            meta["annotations"] = dict(self.placement.pod_annotations)
        return meta


def image_of(cfg: RootConfig) -> str:
    """launcher.k8s.image, required.

    Raises:
        UserError: Not set, or not one token.
    """
    image = cfg.launcher.k8s.image
    if not image:
        raise UserError(
            "launcher=kubernetes needs launcher.k8s.image: an image with llmctl[train] "
            "installed (llmctl ships none)"
        )
    if any(c.isspace() for c in str(image)):
        raise UserError(f"launcher.k8s.image={image!r} contains whitespace")
    return str(image)


def pod_parts(cfg: RootConfig, run_dir: str | Path, layout: Layout) -> PodParts:
    """Everything the pods of this run share, checked (pure apart from the planner call)."""
    k8s = cfg.launcher.k8s
    image_of(cfg)
    _dns_label("launcher.k8s.namespace", str(k8s.namespace))
    check_run_dir(cfg, run_dir)
    if k8s.max_restarts < 0:
        raise UserError(f"launcher.k8s.max_restarts must be >= 0, got {k8s.max_restarts}")
    shape = launch_shape(cfg, layout, cfg.cluster.num_nodes)
    name = job_name(cfg, run_dir)
    labels = {RUN_LABEL: name}
    volumes, mounts = _volumes(cfg)
    env_from = [
        {"secretRef": {"name": _dns_label("launcher.k8s.env_from_secrets", str(s), 253)}}
        for s in k8s.env_from_secrets
    ]
    return PodParts(
        name=name,
        shape=shape,
        command=container_command(cfg, run_dir, str(k8s.api)),
        env=pod_env(cfg, shape),
        env_from=env_from,
        resources=pod_resources(cfg, shape),
        volumes=volumes,
        mounts=mounts,
        grace=grace_period(cfg, layout, shape.nproc_per_node),
        placement=plan_placement(cfg, layout, shape, name),
        labels=labels,
    )


def _metadata(cfg: RootConfig, name: str, *, queue: bool) -> dict[str, Any]:
    labels = {RUN_LABEL: name}
    if queue and cfg.launcher.k8s.kueue_queue:
        labels["kueue.x-k8s.io/queue-name"] = _dns_label(
            "launcher.k8s.kueue_queue", str(cfg.launcher.k8s.kueue_queue), 253
        )
    return {"name": name, "namespace": str(cfg.launcher.k8s.namespace), "labels": labels}


def _failure_policy(cfg: RootConfig) -> dict[str, Any]:
    """Restart the whole job on a failure (each restart resumes); preemptions are free."""
    return {
        "maxRestarts": int(cfg.launcher.k8s.max_restarts),
        "restartStrategy": "BlockingRecreate",
        "rules": [{"name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts",
                   "onJobFailureReasons": ["PodFailurePolicy"]}],
    }  # fmt: skip


def _job_spec(parts: PodParts, pod_spec: dict[str, Any], *, counts: bool) -> dict[str, Any]:
    """A batch/v1 Job spec: no pod retries (the JobSet restarts the whole job), a preempted
    pod fails its Job with reason PodFailurePolicy."""
    spec: dict[str, Any] = {}
    if counts:
        n = parts.shape.num_nodes
        spec.update(parallelism=n, completions=n, completionMode="Indexed")
    spec["backoffLimit"] = 0
    spec["podFailurePolicy"] = {"rules": [
        {"action": "FailJob",
         "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}  # fmt: skip
    spec["template"] = {"metadata": parts.template_metadata(), "spec": pod_spec}
    return spec


def render_jobset(cfg: RootConfig, parts: PodParts) -> list[dict[str, Any]]:
    """A JobSet of one replicated Job "node" (one pod per node), PET_* set by llmctl."""
    port = int(cfg.launcher.rdzv_port)
    pet = _jobset_pet_env(parts.name, parts.shape, port)
    container = parts.container(cfg, "node", pet=pet)
    container["ports"] = [{"containerPort": port, "name": "rdzv"}]
    spec = {
        "failurePolicy": _failure_policy(cfg),
        "network": {"enableDNSHostnames": True, "subdomain": parts.name},
        "replicatedJobs": [{"name": "node", "replicas": 1, "template": {
            "spec": _job_spec(parts, parts.pod_spec(cfg, container), counts=True)}}],
    }  # fmt: skip
    return [{"apiVersion": API_VERSIONS["jobset"], "kind": "JobSet",
             "metadata": _metadata(cfg, parts.name, queue=True), "spec": spec}]  # fmt: skip


def render_pytorchjob(cfg: RootConfig, parts: PodParts) -> list[dict[str, Any]]:
    """A PyTorchJob: one Master and num_nodes - 1 Workers; pods restart on failure."""
    port = int(cfg.launcher.rdzv_port)
    container = parts.container(cfg, "pytorch", pet=[])
    container["ports"] = [{"containerPort": port, "name": "pytorchjob-port"}]
    pod = parts.pod_spec(cfg, container)
    pod.pop("restartPolicy")  # the replica's restartPolicy decides

    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": {"metadata": parts.template_metadata(), "spec": pod}}  # fmt: skip

    specs = {"Master": replica(1)}
    if parts.shape.num_nodes > 1:
        specs["Worker"] = replica(parts.shape.num_nodes - 1)
    spec = {
        "nprocPerNode": str(parts.shape.nproc_per_node),
        "runPolicy": {"backoffLimit": int(cfg.launcher.k8s.max_restarts), "cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": specs,
    }
    return [{"apiVersion": API_VERSIONS["pytorchjob"], "kind": "PyTorchJob",
             "metadata": _metadata(cfg, parts.name, queue=True), "spec": spec}]  # fmt: skip


def render_trainjob(cfg: RootConfig, parts: PodParts) -> list[dict[str, Any]]:
    """A TrainJob; with no runtime_ref, preceded by a TrainingRuntime of its own."""
    k8s = cfg.launcher.k8s
    trainer = {
        "image": image_of(cfg),
        "command": parts.command,
        "env": parts.env,
        "numNodes": parts.shape.num_nodes,
        "numProcPerNode": parts.shape.nproc_per_node,
        "resourcesPerNode": parts.resources,
    }
    objects: list[dict[str, Any]] = []
    if k8s.runtime_ref:
        runtime = _dns_label("launcher.k8s.runtime_ref", str(k8s.runtime_ref), 253)
        ref = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
               "name": runtime}  # fmt: skip
        spec: dict[str, Any] = {"runtimeRef": ref, "trainer": trainer,
                                "runtimePatches": [_runtime_patch(cfg, parts)]}  # fmt: skip
    else:
        objects.append(_training_runtime(cfg, parts))
        ref = {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": parts.name}
        spec = {"runtimeRef": ref, "trainer": trainer}
    objects.append({"apiVersion": API_VERSIONS["trainjob"], "kind": "TrainJob",
                    "metadata": _metadata(cfg, parts.name, queue=True), "spec": spec})  # fmt: skip
    return objects


def _training_runtime(cfg: RootConfig, parts: PodParts) -> dict[str, Any]:
    """The job's own TrainingRuntime: Trainer's torch policy and llmctl's restart policy."""
    container = parts.container(cfg, "node", pet=[])
    container.pop("env")  # the TrainJob's trainer.env; PET_* come from the torch plugin
    container.pop("command")
    container.pop("resources")
    job = {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": _job_spec(parts, parts.pod_spec(cfg, container), counts=False),
    }
    spec = {
        "mlPolicy": {"numNodes": parts.shape.num_nodes, "torch": {}},
        "template": {"spec": {
            "failurePolicy": _failure_policy(cfg),
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": job}]}},
    }  # fmt: skip
    meta = _metadata(cfg, parts.name, queue=False)
    meta["labels"]["trainer.kubeflow.org/framework"] = "torch"
    return {"apiVersion": API_VERSIONS["trainjob"], "kind": "TrainingRuntime", "metadata": meta,
            "spec": spec}  # fmt: skip


def _runtime_patch(cfg: RootConfig, parts: PodParts) -> dict[str, Any]:
    """runtimePatches entry (Trainer v2.3) carrying the pod settings a ClusterTrainingRuntime
    does not know: volumes, placement, grace period, service account.

    Raises:
        UserError: launcher.k8s.env_from_secrets (a patch cannot add envFrom).
    """
    if parts.env_from:
        raise UserError(
            "launcher.k8s.env_from_secrets cannot be patched into a ClusterTrainingRuntime "
            "(launcher.k8s.runtime_ref); list the keys in launcher.secrets instead"
        )
    pod = parts.pod_spec(cfg, {"name": "node", "volumeMounts": parts.mounts})
    pod.pop("restartPolicy")
    pod.pop("topologySpreadConstraints", None)  # not patchable: noted in the explanation
    job = {"name": "node", "template": {"spec": {"template": {
        "metadata": parts.template_metadata(), "spec": pod}}}}  # fmt: skip
    return {"manager": "llmctl.dev/launcher",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}  # fmt: skip


RENDERERS = {"trainjob": render_trainjob, "jobset": render_jobset, "pytorchjob": render_pytorchjob}


@dataclass(frozen=True, slots=True, kw_only=True)
class K8sManifest:
    """The rendering of a Kubernetes launch: the objects and their YAML text."""

    api: str
    name: str
    namespace: str
    text: str
    objects: tuple[dict[str, Any], ...]
    explanation: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        """`k8s` of the --dry-run --json view: the YAML, the objects, the placement."""
        return {"k8s": {"api": self.api, "name": self.name, "namespace": self.namespace,
                        "yaml": self.text, "placement": list(self.explanation)}}  # fmt: skip

    def sections(self) -> list[tuple[str, str]]:
        """The placement explanation, then the YAML kubectl applies, byte for byte."""
        return [
            ("kubernetes placement", "\n".join(self.explanation)),
            (
                f"kubernetes objects ({MANIFEST}, applied with kubectl create -f)",
                self.text.rstrip("\n"),
            ),
        ]

    def recorded(self) -> dict[str, Any]:
        """launch.json keeps where the job lives (kubectl finds it again by these)."""
        main = self.objects[-1]
        return {"k8s": {"api": self.api, "name": self.name, "namespace": self.namespace,
                        "kind": main["kind"], "resource": RESOURCES[self.api]}}  # fmt: skip


def render_manifest(
    cfg: RootConfig, run_dir: str | Path, layout: Layout | None = None
) -> K8sManifest:
    """The objects of a Kubernetes launch and their YAML (pure apart from planning the layout).

    Raises:
        UserError: A missing image or claim, a bad name or quantity, secrets without a Secret,
            or a placement the cluster cannot guarantee.
    """
    import yaml

    lay = layout_of(cfg, layout)
    api = str(cfg.launcher.k8s.api)
    parts = pod_parts(cfg, run_dir, lay)
    objects = RENDERERS[api](cfg, parts)
    header = (
        f"# Rendered by llmctl for run {run_dir} (launcher.k8s.api={api}).\n"
        f"# Submit: kubectl create -f {Path(run_dir) / MANIFEST}\n"
    )
    body = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=4096)
    explanation = [*parts.placement.lines, parts.grace.explain(int(cfg.launcher.k8s.min_grace_s))]
    if api == "trainjob" and cfg.launcher.k8s.runtime_ref:
        explanation.append(
            f"restarts: as ClusterTrainingRuntime {cfg.launcher.k8s.runtime_ref} defines them; "
            "runtimePatches need Trainer v2.3 (terminationGracePeriodSeconds); topology spread "
            "is not patchable"
        )
    else:
        explanation.append(
            f"restarts: the whole job up to {cfg.launcher.k8s.max_restarts} time(s) after a "
            "failure, without limit after a preemption; each restart resumes from the newest "
            "checkpoint"
            if api != "pytorchjob"
            else f"restarts: each failed pod in place (OnFailure), backoffLimit "
            f"{cfg.launcher.k8s.max_restarts}; the group re-forms at the master and resumes"
        )
    return K8sManifest(
        api=api,
        name=parts.name,
        namespace=str(cfg.launcher.k8s.namespace),
        text=header + body,
        objects=tuple(objects),
        explanation=tuple(explanation),
    )


class KubernetesBackend:
    """`launcher=kubernetes`: kubectl creates the objects; `llmctl train` returns."""

    holds_lock = False  # rank 0 of the job takes the lock
    port_spread = 0

    def configure(self, cfg: RootConfig) -> RootConfig:
        """No defaults of its own."""
        return cfg

    def render(self, cfg: RootConfig, run_dir: Path, layout: Layout) -> K8sManifest:
        """`render_manifest`."""
        return render_manifest(cfg, run_dir, layout)

    def check(self, launch: TrainLaunch) -> None:
        """kubectl on PATH."""
        from llmctl.launch.k8s_kubectl import kubectl_path

        kubectl_path()

    def execute(
        self, launch: TrainLaunch, *, echo: TextIO | None, lock: RunLock | None, started: Started
    ) -> Outcome:
        """Write RUN_DIR/k8s.yaml and `kubectl create -f` it; record the job."""
        from llmctl.launch.backend import Outcome
        from llmctl.launch.k8s_kubectl import submit

        manifest = _manifest(launch)
        job = submit(manifest, launch.run_dir)
        started({"job_id": job})
        return Outcome(job_id=job)

    def status(self, run_dir: Path, record: dict[str, Any]) -> RunStatus:
        """The job's state from `kubectl get -o json`."""
        from llmctl.launch.k8s_kubectl import job_status

        return job_status(run_dir, record)

    def log_path(self, run_dir: Path, record: dict[str, Any]) -> Path:
        """RUN_DIR/logs/k8s-node0.log, refreshed from `kubectl logs` of node 0's pod."""
        from llmctl.launch.k8s_kubectl import fetch_logs

        return fetch_logs(run_dir, record)

    def cancel(self, run_dir: Path, record: dict[str, Any]) -> None:
        """`kubectl delete -f RUN_DIR/k8s.yaml`: pods get SIGTERM and their grace period."""
        from llmctl.launch.k8s_kubectl import delete

        delete(run_dir, record)


def _manifest(launch: TrainLaunch) -> K8sManifest:
    if not isinstance(launch.rendering, K8sManifest):
        raise TypeError(f"launcher=kubernetes cannot run a {type(launch.rendering).__name__}")
    return launch.rendering


if TYPE_CHECKING:  # mypy checks that the class implements the launcher protocol
    _PROTOCOL: type[Backend] = KubernetesBackend
