"""Validation of rendered Kubernetes objects: published CRD schemas and the core schemas.

CRDs: the copies in tests/fixtures/k8s/crds (source and version in its README), checked with
jsonschema against the served version's openAPIV3Schema, `x-kubernetes-*` keys removed and
object schemas with listed properties closed (unknown fields refused, as kubectl's strict
field validation does). Core objects (the Jobs, pod templates and pods inside) are checked with
kubernetes-validate, strict, against its bundled Kubernetes schemas.

The Trainer builds the pods of a TrainJob from the runtime and the TrainJob's trainer fields;
`trainjob_pod` composes that pod the way the torch plugin documents it (trainer image, command,
env and resourcesPerNode on the container "node", PET_* added) so the core schema sees it.
"""

from __future__ import annotations

import copy
import functools
import gzip
from pathlib import Path
from typing import Any

import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "k8s" / "crds"
CORE_VERSION = "1.33"
TRAINJOB_CRDS = ("trainer-v2.2.1", "trainer-v2.3.0")
PYTORCHJOB_CRDS = ("training-operator-v1.9.0", "training-operator-v1.9.4")
JOBSET_CRDS = ("jobset-v0.12.0",)
_PLURAL = {"TrainJob": "trainjobs", "TrainingRuntime": "trainingruntimes", "JobSet": "jobsets",
           "PyTorchJob": "pytorchjobs"}  # fmt: skip


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strip(v) for k, v in node.items() if not str(k).startswith("x-kubernetes-")}
        props = out.get("properties")
        closed = "additionalProperties" in out or node.get("x-kubernetes-preserve-unknown-fields")
        if isinstance(props, dict) and props and not closed:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


@functools.cache
def crd_schema(release: str, kind: str) -> dict[str, Any]:
    """The openAPIV3Schema (stripped, closed) of `kind` in the CRD file of `release`."""
    path = CRD_DIR / f"{release}-{_PLURAL[kind]}.yaml.gz"
    crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=yaml.CSafeLoader)
    assert crd["spec"]["names"]["kind"] == kind, path
    group = crd["spec"]["group"]
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    schema = _strip(version["schema"]["openAPIV3Schema"])
    schema["_apiVersion"] = f"{group}/{version['name']}"
    return schema


def validate_crd(obj: dict[str, Any], release: str) -> None:
    """Raise jsonschema.ValidationError unless `obj` is valid for the CRD of `release`."""
    import jsonschema

    schema = dict(crd_schema(release, obj["kind"]))
    api = schema.pop("_apiVersion")
    assert obj["apiVersion"] == api, (obj["apiVersion"], api)
    jsonschema.Draft7Validator(schema).validate(obj)


def validate_core(obj: dict[str, Any]) -> None:
    """Raise unless `obj` is a valid core object (kubernetes-validate, strict)."""
    import kubernetes_validate

    kubernetes_validate.validate(obj, CORE_VERSION, strict=True)


def _job(meta: dict[str, Any], job_spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}


def trainjob_pod(job: dict[str, Any], runtime: dict[str, Any] | None) -> dict[str, Any]:
    """The pod the Trainer makes of a TrainJob (and its own TrainingRuntime, if any)."""
    trainer = job["spec"]["trainer"]
    if runtime is not None:
        rjob = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
        template = copy.deepcopy(rjob["template"]["spec"]["template"])
    else:
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
        rjob = patch["template"]["spec"]["replicatedJobs"][0]
        template = copy.deepcopy(rjob["template"]["spec"]["template"])
        template["spec"]["restartPolicy"] = "Never"
    (container,) = template["spec"]["containers"]
    name = job["metadata"]["name"]
    pet = [
        {"name": "PET_NNODES", "value": str(trainer["numNodes"])},
        {"name": "PET_NPROC_PER_NODE", "value": str(trainer["numProcPerNode"])},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
    ]  # fmt: skip
    container.update(
        image=trainer["image"],
        command=trainer["command"],
        env=[*trainer["env"], *pet],
        resources=trainer["resourcesPerNode"],
    )
    meta = {"name": f"{name}-node-0-0", "namespace": job["metadata"]["namespace"],
            **template.get("metadata", {})}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def core_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The core objects inside rendered objects: Jobs, pod templates, the TrainJob's pod."""
    out: list[dict[str, Any]] = []
    runtime = next((o for o in objects if o["kind"] == "TrainingRuntime"), None)
    for obj in objects:
        meta = {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}
        if obj["kind"] == "JobSet":
            for rj in obj["spec"]["replicatedJobs"]:
                out.append(_job(meta, rj["template"]["spec"]))
        elif obj["kind"] == "TrainingRuntime":
            rj = obj["spec"]["template"]["spec"]["replicatedJobs"][0]
            out.append(_job(meta, rj["template"]["spec"]))
        elif obj["kind"] == "TrainJob":
            out.append(trainjob_pod(obj, runtime))
        elif obj["kind"] == "PyTorchJob":
            for replica in obj["spec"]["pytorchReplicaSpecs"].values():
                out.append({"apiVersion": "v1", "kind": "PodTemplate", "metadata": meta,
                            "template": replica["template"]})  # fmt: skip
    return out


def releases_for(obj: dict[str, Any], *, patched: bool = False) -> tuple[str, ...]:
    """The CRD releases an object of this kind is validated against."""
    kind = obj["kind"]
    if kind in ("TrainJob", "TrainingRuntime"):
        return ("trainer-v2.3.0",) if patched else TRAINJOB_CRDS
    return JOBSET_CRDS if kind == "JobSet" else PYTORCHJOB_CRDS


def validate_all(objects: list[dict[str, Any]]) -> list[str]:
    """Validate every rendered object and the core objects inside; returns what was checked."""
    checked = []
    patched = any("runtimePatches" in o.get("spec", {}) for o in objects)
    for obj in objects:
        for release in releases_for(obj, patched=patched):
            validate_crd(obj, release)
            checked.append(f"{obj['kind']}@{release}")
    for core in core_objects(objects):
        validate_core(core)
        checked.append(f"{core['kind']}@k8s-{CORE_VERSION}")
    return checked


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion of a command argument: a defined variable is replaced,
    an undefined reference is left as it is, `$$` is one `$` (Kubernetes API, Container)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) > 0:
            name = text[i + 2 : end]
            out.append(env.get(name, text[i : end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
