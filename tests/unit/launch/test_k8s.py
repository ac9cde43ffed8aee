"""`launcher=kubernetes` renderings: valid against the published CRDs and the core schemas,
pinned by golden files, placed as the plan assumes, named and quoted safely, no secret values.

Oracles outside llmctl: the CRD copies of Kubeflow Trainer v2.2.1/v2.3.0, JobSet v0.12.0 and
training-operator v1.9.0/v1.9.4 (tests/fixtures/k8s/crds, checked with jsonschema) and the
Kubernetes 1.33 schemas bundled with kubernetes-validate (strict). No API server runs here:
admission, CEL rules, defaulting and scheduling are not exercised (docs/launch.md).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from k8s_support import kubelet_expand, validate_all, validate_core, validate_crd
from typer.testing import CliRunner

from llmctl.cli.main import app
from llmctl.errors import UserError
from llmctl.launch.api import prepare_train
from llmctl.launch.backend import TrainLaunch
from llmctl.launch.k8s import RUN_LABEL, K8sManifest, job_name, render_manifest

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "k8s"
RUN_DIR = "/runs/golden-run"
BASE = [
    "launcher=kubernetes",
    "launcher.k8s.image=registry.example.com/llmctl:0.1",
    "launcher.k8s.pvc=llmctl-runs",
    "launcher.k8s.pvc_mount=/runs",
    f"train.run_dir={RUN_DIR}",
]
LLAMA = "llama3_8b_pretrain_8gpu_h100_fp8"
PLANS: dict[str, tuple[str, list[str]]] = {
    "cpu_1node": ("tiny_cpu", []),
    "cpu_2nodes": ("tiny_cpu", ["cluster.num_nodes=2", "parallel.dp=2"]),
    "h100_2nodes": (LLAMA, [
        "cluster.num_nodes=2", "launcher.k8s.rdma_resource=rdma/ib",
        "launcher.k8s.rdma_per_node=8", "launcher.k8s.nccl_ib_hca=mlx5",
        "launcher.secrets=[WANDB_API_KEY]", "launcher.k8s.secret_name=llmctl-secrets",
        "launcher.k8s.env_from_secrets=[s3-credentials]", "launcher.k8s.service_account=trainer",
    ]),
    # TP8 on GB200 trays of 4 GPUs: each TP group spans two pods of one NVL72 clique.
    "nvl72_tp8": (LLAMA, ["cluster=gb200_nvl72", "cluster.num_nodes=4", "parallel.tp=8",
                          "parallel.pp=1", "parallel.dp=2"]),
    "preemptible": (LLAMA, [
        "cluster.num_nodes=4", "launcher.k8s.kueue_queue=spot-queue",
        "launcher.k8s.kueue_topology=cloud.provider.com/topology-block",
        "launcher.k8s.node_selector={cloud.google.com/gke-spot: 'true'}",
        "launcher.k8s.max_restarts=10", "checkpoint.interval=100",
    ]),
}  # fmt: skip
APIS = ("trainjob", "jobset", "pytorchjob")


@functools.cache
def _launch(plan: str) -> TrainLaunch:
    recipe, overrides = PLANS[plan]
    return prepare_train(recipe, [*BASE, *overrides], force=True)


def _render(plan: str, api: str, **k8s: Any) -> tuple[K8sManifest, TrainLaunch]:
    launch = _launch(plan)
    cfg = copy.deepcopy(launch.cfg)
    cfg.launcher.k8s.api = api
    for key, value in k8s.items():
        setattr(cfg.launcher.k8s, key, value)
    return render_manifest(cfg, launch.run_dir, launch.layout), launch


def _objects(manifest: K8sManifest) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(manifest.text))


def _pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        spec = obj["spec"]
        if obj["kind"] == "JobSet":
            out += [rj["template"]["spec"]["template"] for rj in spec["replicatedJobs"]]
        elif obj["kind"] == "TrainingRuntime":
            rjs = spec["template"]["spec"]["replicatedJobs"]
            out += [rj["template"]["spec"]["template"] for rj in rjs]
        elif obj["kind"] == "PyTorchJob":
            out += [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
        elif obj["kind"] == "TrainJob" and "runtimePatches" in spec:
            rjs = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
            out += [rj["template"]["spec"]["template"] for rj in rjs["replicatedJobs"]]
    return out


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LLMCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"missing golden file {path}: run with LLMCTL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"rendering differs from {path}; LLMCTL_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("plan", list(PLANS))
def test_every_object_validates_against_crds_and_core_schemas(plan: str, api: str) -> None:
    manifest, launch = _render(plan, api)
    objects = _objects(manifest)
    checked = validate_all(objects)
    want = {
        "trainjob": {"TrainingRuntime@trainer-v2.2.1", "TrainingRuntime@trainer-v2.3.0",
                     "TrainJob@trainer-v2.2.1", "TrainJob@trainer-v2.3.0", "Job@k8s-1.33",
                     "Pod@k8s-1.33"},
        "jobset": {"JobSet@jobset-v0.12.0", "Job@k8s-1.33"},
        "pytorchjob": {"PyTorchJob@training-operator-v1.9.0",
                       "PyTorchJob@training-operator-v1.9.4", "PodTemplate@k8s-1.33"},
    }  # fmt: skip
    assert set(checked) == want[api]
    nodes = launch.cfg.cluster.num_nodes
    for template in _pod_templates(objects):
        assert template["metadata"]["labels"][RUN_LABEL] == manifest.name  # selectors match
        spec = template["spec"]
        assert spec["terminationGracePeriodSeconds"] >= launch.cfg.launcher.k8s.min_grace_s
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
        (container,) = spec["containers"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert mounts == {"/dev/shm", "/runs"}
        if nodes > 1:
            (spread,) = spec["topologySpreadConstraints"]
            assert spread["topologyKey"] == "kubernetes.io/hostname"
            assert spread["whenUnsatisfiable"] == "DoNotSchedule"


def test_trainjob_with_cluster_runtime_patches_validate_on_v2_3_only() -> None:
    manifest, _ = _render("nvl72_tp8", "trainjob", runtime_ref="torch-distributed")
    objects = _objects(manifest)
    assert [o["kind"] for o in objects] == ["TrainJob"]
    assert validate_all(objects) == ["TrainJob@trainer-v2.3.0", "Pod@k8s-1.33"]
    # Trainer v2.2 cannot patch terminationGracePeriodSeconds: the version statement holds.
    with pytest.raises(jsonschema.ValidationError, match="terminationGracePeriodSeconds"):
        validate_crd(objects[0], "trainer-v2.2.1")


GOLDENS = [
    ("cpu_2nodes", "trainjob"),
    ("cpu_2nodes", "jobset"),
    ("cpu_2nodes", "pytorchjob"),
    ("h100_2nodes", "jobset"),
    ("nvl72_tp8", "trainjob"),
    ("preemptible", "jobset"),
]


@pytest.mark.parametrize(("plan", "api"), GOLDENS)
def test_rendered_yaml_is_golden(plan: str, api: str) -> None:
    manifest, _ = _render(plan, api)
    _golden(f"{plan}-{api}.yaml", manifest.text)
    _golden(f"{plan}-{api}.placement.txt", "\n".join(manifest.explanation) + "\n")


def test_cluster_runtime_rendering_is_golden() -> None:
    manifest, _ = _render("nvl72_tp8", "trainjob", runtime_ref="torch-distributed")
    _golden("nvl72_tp8-trainjob-runtime_ref.yaml", manifest.text)


def test_schema_checks_refuse_broken_objects() -> None:
    """The validators bite: a mutated object of each kind is refused."""
    (runtime, job) = _objects(_render("cpu_2nodes", "trainjob")[0])
    bad = copy.deepcopy(job)
    bad["spec"]["trainer"]["numNodes"] = "2"
    for release in ("trainer-v2.2.1", "trainer-v2.3.0"):
        with pytest.raises(jsonschema.ValidationError, match="'2' is not of type 'integer'"):
            validate_crd(bad, release)
    typo = copy.deepcopy(job)
    typo["spec"]["trainer"]["imagee"] = typo["spec"]["trainer"].pop("image")
    with pytest.raises(jsonschema.ValidationError, match="imagee"):
        validate_crd(typo, "trainer-v2.3.0")
    (jobset,) = _objects(_render("cpu_2nodes", "jobset")[0])
    jobset["spec"]["failurePolicy"]["rules"][0]["action"] = "Retry"
    with pytest.raises(jsonschema.ValidationError, match="'Retry' is not one of"):
        validate_crd(jobset, "jobset-v0.12.0")
    (ptj,) = _objects(_render("cpu_2nodes", "pytorchjob")[0])
    ptj["spec"]["nprocPerNode"] = 1
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        validate_crd(ptj, "training-operator-v1.9.4")
    job_obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
               "spec": copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"][0][
                   "template"]["spec"])}  # fmt: skip
    validate_core(job_obj)
    job_obj["spec"]["completions"] = "2"
    with pytest.raises(Exception, match="'2' is not of type"):
        validate_core(job_obj)


def test_tp8_on_nvl72_keeps_every_tp_group_in_one_clique() -> None:
    manifest, launch = _render("nvl72_tp8", "jobset")
    assert (launch.layout.tp, launch.cfg.cluster.gpus_per_node) == (8, 4)  # 2 pods per group
    (template,) = _pod_templates(_objects(manifest))
    (term,) = template["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]  # fmt: skip
    assert term["topologyKey"] == "nvidia.com/gpu.clique"
    assert term["labelSelector"] == {"matchLabels": {RUN_LABEL: manifest.name}}
    assert any("fits one NVLink domain" in line for line in manifest.explanation)
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["NCCL_MNNVL_ENABLE"] == "1"  # NVLink across trays


def test_job_larger_than_a_clique_needs_kueue_slices() -> None:
    with pytest.raises(UserError, match=r"spans 2 pods and the job \(36 pods\) is larger"):
        _render_nodes(36)
    manifest = _render_nodes(36, kueue_queue="gb200")
    (template,) = _pod_templates(_objects(manifest))
    assert "affinity" not in template["spec"]
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-slice-required-topology": "nvidia.com/gpu.clique",
        "kueue.x-k8s.io/podset-slice-size": "2",
    }
    (jobset,) = _objects(manifest)
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gb200"
    validate_all(_objects(manifest))


def _render_nodes(nodes: int, **k8s: Any) -> K8sManifest:
    launch = _launch("nvl72_tp8")
    cfg = copy.deepcopy(launch.cfg)
    cfg.cluster.num_nodes = nodes
    cfg.parallel.dp = nodes * 4 // 8
    cfg.launcher.k8s.api = "jobset"
    for key, value in k8s.items():
        setattr(cfg.launcher.k8s, key, value)
    from dataclasses import replace

    layout = replace(launch.layout, dp=nodes * 4 // 8)
    return render_manifest(cfg, launch.run_dir, layout)


def test_tp_inside_a_node_needs_no_affinity_and_dp_spreads() -> None:
    manifest, _ = _render("preemptible", "jobset")
    (template,) = _pod_templates(_objects(manifest))
    assert "affinity" not in template["spec"]
    assert template["spec"]["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert template["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-preferred-topology": "cloud.provider.com/topology-block"
    }
    (jobset,) = _objects(manifest)
    policy = jobset["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 10 and policy["restartStrategy"] == "BlockingRecreate"
    assert policy["rules"][0]["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 0 and job["completionMode"] == "Indexed"
    assert job["parallelism"] == job["completions"] == 4


def test_gpus_rdma_nccl_and_secrets_by_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "wandb-v4lue-never-written")
    manifest, _ = _render("h100_2nodes", "jobset")
    assert "wandb-v4lue-never-written" not in manifest.text
    (template,) = _pod_templates(_objects(manifest))
    (c,) = template["spec"]["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "8"}
    assert c["resources"]["requests"] == c["resources"]["limits"]
    env = {e["name"]: e for e in c["env"]}
    assert env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY", "valueFrom": {
        "secretKeyRef": {"name": "llmctl-secrets", "key": "WANDB_API_KEY"}}}  # fmt: skip
    assert c["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert env["NCCL_IB_HCA"]["value"] == "mlx5" and env["NCCL_IB_DISABLE"]["value"] == "0"
    assert env["PET_NNODES"]["value"] == "2" and env["PET_NPROC_PER_NODE"]["value"] == "8"
    assert env["PET_MASTER_ADDR"]["value"] == f"{manifest.name}-node-0-0.{manifest.name}"
    assert template["spec"]["serviceAccountName"] == "trainer"


def test_secrets_need_a_secret_name() -> None:
    with pytest.raises(UserError, match=r"launcher\.k8s\.secret_name"):
        _render("h100_2nodes", "jobset", secret_name=None)


def test_grace_period_covers_the_planned_step_and_save() -> None:
    manifest, launch = _render("h100_2nodes", "jobset")
    mem = launch.plan.memory_gib  # what plan.json records for the chosen layout
    gib = (mem["weights"] + mem["optimizer"]) * 8
    save_s = gib * 2**30 / 1e9  # 1 GB/s per pod
    want = max(60, math.ceil(launch.plan.step_time_s + save_s) + 30)
    (template,) = _pod_templates(_objects(manifest))
    assert template["spec"]["terminationGracePeriodSeconds"] == want > 60
    faster, _ = _render("h100_2nodes", "jobset", checkpoint_write_gb_s=10.0)
    (t2,) = _pod_templates(_objects(faster))
    assert 60 <= t2["spec"]["terminationGracePeriodSeconds"] < want
    tiny, _ = _render("cpu_1node", "jobset")
    assert _pod_templates(_objects(tiny))[0]["spec"]["terminationGracePeriodSeconds"] == 60


def test_names_from_odd_run_dirs_are_sanitized_and_quoted() -> None:
    cfg = copy.deepcopy(_launch("cpu_1node").cfg)
    assert job_name(cfg, "/runs/My Run_ü 2026!.x") == "my-run-2026-x"
    assert job_name(cfg, "/runs/2026-01-01") == "r-2026-01-01"
    long_a, long_b = (job_name(cfg, "/runs/" + "a" * 60 + s) for s in ("-one", "-two"))
    assert len(long_a) <= 40 and long_a != long_b
    for name in (long_a, long_b, "my-run-2026-x"):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    odd = '/runs/it\'s a: "run" #1'
    cfg.train.run_dir = odd
    manifest = render_manifest(cfg, Path(odd), _launch("cpu_1node").layout)
    objects = _objects(manifest)
    assert objects[-1]["spec"]["trainer"]["command"][-1] == odd  # YAML quoting round-trips
    assert manifest.name == "it-s-a-run-1"
    validate_all(objects)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("launcher.k8s.job_name=Bad_Name", "launcher.k8s.job_name='Bad_Name' is not a Kubernetes"),
        ("launcher.k8s.namespace=prod-ns-", "launcher.k8s.namespace='prod-ns-' is not"),
        ("launcher.k8s.shm_size=lots", "launcher.k8s.shm_size='lots' is not a Kubernetes quantity"),
        ("launcher.k8s.image=null", "launcher=kubernetes needs launcher.k8s.image"),
        ("launcher.k8s.pvc=null", "launcher=kubernetes needs launcher.k8s.pvc"),
        ("launcher.k8s.pvc_mount=/data", "is not under launcher.k8s.pvc_mount=/data"),
        ("launcher.env={PET_NNODES: '3'}", "PET_NNODES is set by the Kubernetes controller"),
    ],
)
def test_bad_values_are_refused_in_one_line(override: str, message: str) -> None:
    with pytest.raises(UserError) as info:
        prepare_train("tiny_cpu", [*BASE, override])
    assert message in info.value.message
    assert "\n" not in info.value.message  # the console entry point prints it as one line


def test_dry_run_prints_the_yaml_byte_for_byte() -> None:
    res = CliRunner().invoke(app, ["train", "recipe=tiny_cpu", *BASE, "--dry-run"])
    assert res.exit_code == 0, res.output
    manifest, _ = _render("cpu_1node", "trainjob")
    head = "# --- kubernetes objects (k8s.yaml, applied with kubectl create -f) ---\n"
    start = res.output.index(head) + len(head)
    end = res.output.index("# --- resolved config ---\n")
    assert res.output[start:end] == manifest.text
    placement = res.output[res.output.index("# --- kubernetes placement ---\n") :]
    assert "terminationGracePeriodSeconds=60" in placement.split("# --- kubernetes obj")[0]


def test_kubernetes_dry_run_loads_no_torch(tmp_path: Path) -> None:
    """Rendering (planner call included) stays on the torch-free side, as for other launchers."""
    import subprocess
    import sys
    import textwrap

    argv = ["llmctl", "train", "recipe=tiny_cpu", *BASE, "--dry-run"]
    code = textwrap.dedent(f"""
        import sys
        sys.argv = {argv!r}
        from llmctl.cli.main import main
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        heavy = {{m.split(".")[0] for m in sys.modules}} & {{"torch", "megatron", "jobset"}}
        print("HEAVY=" + ",".join(sorted(heavy)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "HEAVY="


def test_docs_example_is_the_real_output() -> None:
    """docs/launch.md's Kubernetes example is what `--dry-run` prints today."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "launch.md").read_text()
    block = docs.split("Example: Llama 3 8B, TP8 on four GB200", 1)[1].split("```\n", 2)[1]
    command, shown = block.split("\ndry run:", 1)
    argv = command.replace("\\\n", " ").split()[2:]  # after "$ llmctl"
    argv = [a.strip("'") for a in argv]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    printed = res.output[: res.output.index("# --- resolved config ---\n")]
    assert "dry run:" + shown == printed


def test_dollar_signs_reach_the_pod_verbatim() -> None:
    """The kubelet expands `$(VAR)` and `$$` in commands and env values: a run directory or a
    launcher.env value holding them arrives unchanged, while llmctl's $(PET_*) expand."""
    cfg = copy.deepcopy(_launch("cpu_1node").cfg)
    odd = "/runs/cost$(HOME)$$x"
    cfg.train.run_dir = odd
    cfg.launcher.env = {"LLMCTL_NOTE": "a$(HOME)b$$c"}
    manifest = render_manifest(cfg, Path(odd), _launch("cpu_1node").layout)
    trainer = _objects(manifest)[-1]["spec"]["trainer"]
    pod_env = {"HOME": "/root", "PET_NNODES": "1", "PET_NODE_RANK": "0"}
    argv = [kubelet_expand(a, pod_env) for a in trainer["command"]]
    assert argv[-1] == odd and "--nnodes=1" in argv and "--node-rank=0" in argv
    (note,) = [e["value"] for e in trainer["env"] if e["name"] == "LLMCTL_NOTE"]
    assert kubelet_expand(note, pod_env) == "a$(HOME)b$$c"
