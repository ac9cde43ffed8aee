"""Job-start preflight: does each allocated node have the hardware the plan assumed?

Why: a plan sized for 80 GB H100s with an 8-GPU NVLink domain is wrong on a node with fewer
GPUs, another GPU, less memory, no NVLink or no RDMA NICs, and the first sign is usually an
out-of-memory error or a hang minutes into the job. Comparing a probe of each node with the
cluster description before any rank allocates turns that into one line at start.

The SLURM script runs `python -m llmctl.topology.preflight RUN_DIR` on every node before
torchrun; the ssh launcher runs `python -m llmctl.topology.preflight --probe` on every host
before anything starts (it prints the node's probe as JSON) and judges all answers at once
with `hosts_refusal`.

Pure: `mismatches` compares a `Topology` (probed live or parsed from `nvidia-smi topo -m`)
with the cluster fields; what the topology does not know (topo -m carries no GPU names or
memory, NIC rates need sysfs) is not compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmctl.topology.gpus import match_gpu
from llmctl.topology.model import Topology

#: Relative shortfall of probed GPU memory tolerated (drivers report slightly different sizes).
MEMORY_TOLERANCE = 0.03
#: Fraction of the assumed per-GPU inter-node bandwidth the probed RDMA ports must reach.
NIC_TOLERANCE = 0.9


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    """The hardware facts of a cluster description that a node can be checked against."""

    gpu_name: str
    gpus_per_node: int
    hbm_gib: float
    nvlink_domain_size: int
    internode_bandwidth_gb_s: float
    num_nodes: int
    device: str = "cuda"


def expected_from_cluster(cluster: Mapping[str, Any] | Any) -> Expected:
    """Expected facts from a ClusterConfig (or its dict form)."""

    def get(name: str) -> Any:
        return cluster[name] if isinstance(cluster, Mapping) else getattr(cluster, name)

    return Expected(
        gpu_name=str(get("gpu_name")),
        gpus_per_node=int(get("gpus_per_node")),
        hbm_gib=float(get("hbm_gib")),
        nvlink_domain_size=int(get("nvlink_domain_size")),
        internode_bandwidth_gb_s=float(get("internode_bandwidth_gb_s")),
        num_nodes=int(get("num_nodes")),
        device=str(get("device")),
    )


def mismatches(expected: Expected, node: Topology) -> list[str]:
    """What differs between `node` and the plan's assumptions (empty when it matches)."""
    if expected.device != "cuda":
        return []
    if not node.gpus:
        return [f"no NVIDIA GPU ({node.gpu_error or 'none found'}); the plan assumes GPUs"]
    out = []
    if node.num_gpus != expected.gpus_per_node:
        out.append(f"{node.num_gpus} GPUs, the plan assumes {expected.gpus_per_node}")
    out += _model_and_memory(expected, node)
    want = min(expected.nvlink_domain_size, expected.gpus_per_node)
    if node.nvlink_domain_size < want:
        out.append(
            f"NVLink domain of {node.nvlink_domain_size} GPU(s), the plan assumes {want} "
            "(tensor parallelism would cross PCIe)"
        )
    out += _nics(expected, node)
    return out


def _model_and_memory(expected: Expected, node: Topology) -> list[str]:
    out = []
    name = node.gpus[0].name
    want, have = match_gpu(expected.gpu_name), match_gpu(name) if name else None
    same = have is not None and (
        (want is not None and have.key == want.key) or have.gpu_name == expected.gpu_name
    )
    if name and not same and name != expected.gpu_name:
        out.append(f"GPU {name!r}, the plan assumes {expected.gpu_name!r}")
    memory = node.gpus[0].memory_gib
    if memory is not None and memory < expected.hbm_gib * (1 - MEMORY_TOLERANCE):
        out.append(f"{memory:.1f} GiB per GPU, the plan assumes {expected.hbm_gib:g} GiB")
    return out


def _nics(expected: Expected, node: Topology) -> list[str]:
    if expected.num_nodes <= 1 or expected.internode_bandwidth_gb_s <= 0:
        return []
    if not node.nics:
        return ["no RDMA NIC found; the plan assumes inter-node RDMA"]
    rated = [n for n in node.nics if n.active and n.rate_gbps]
    if not rated:
        return []  # topo -m lists NICs without rates: presence is all that can be checked
    per_gpu = sum(n.rate_gbps or 0.0 for n in rated) / 8 / max(1, node.num_gpus)
    if per_gpu < expected.internode_bandwidth_gb_s * NIC_TOLERANCE:
        return [
            f"RDMA {per_gpu:.1f} GB/s per GPU, the plan assumes "
            f"{expected.internode_bandwidth_gb_s:g} GB/s"
        ]
    return []


def refusal(expected: Expected, nodes: Mapping[str, Topology]) -> str | None:
    """One line refusing the job when any node differs (None when all match)."""
    bad = {host: m for host, topo in nodes.items() if (m := mismatches(expected, topo))}
    if not bad:
        return None
    host, first = next(iter(bad.items()))
    more = f" (and {len(bad) - 1} more node(s))" if len(bad) > 1 else ""
    return (
        f"hardware differs from the plan on {host}: {'; '.join(first)}{more}; "
        "fix the cluster description (llmctl topo --out) or the allocation"
    )


def hosts_refusal(cluster: Mapping[str, Any] | Any, answers: Mapping[str, str]) -> str | None:
    """One refusal line for the hosts whose `--probe` answers (JSON, by host name) differ
    from `cluster` (None when every host matches).

    Raises:
        UserError: an answer that is not a probe, naming the host.
    """
    import json

    from llmctl.errors import UserError
    from llmctl.topology.model import topology_from_dict

    nodes = {}
    for host, text in answers.items():
        try:
            nodes[host] = topology_from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(
                f"host {host}: the hardware probe (python -m llmctl.topology.preflight --probe) "
                f"did not answer with a probe ({exc!s}); is llmctl installed there?"
            ) from None
    return refusal(expected_from_cluster(cluster), nodes)


def check_run_dir(run_dir: str) -> str | None:
    """Probe this node and compare it with RUN_DIR/config.yaml's cluster (None = matches)."""
    import yaml

    from llmctl.errors import UserError
    from llmctl.topology.probe import probe

    path = f"{run_dir}/config.yaml"  # written and validated by the launch (llmctl.run.rundir)
    try:
        with open(path, encoding="utf-8") as f:
            cluster = (yaml.safe_load(f) or {})["cluster"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: cannot read the cluster section ({exc})") from None
    node = probe()
    return refusal(expected_from_cluster(cluster), {node.hostname or "this node": node})


def main(argv: list[str] | None = None) -> int:
    """`python -m llmctl.topology.preflight RUN_DIR`: exit 2 with one line on a mismatch;
    `... --probe`: print this node's probe as JSON (the ssh launcher judges it)."""
    import json
    import sys

    from llmctl.errors import UserError

    args = sys.argv[1:] if argv is None else argv
    if args == ["--probe"]:
        from llmctl.topology.model import to_dict
        from llmctl.topology.probe import probe

        print(json.dumps(to_dict(probe())))
        return 0
    if len(args) != 1:
        print("usage: python -m llmctl.topology.preflight RUN_DIR | --probe", file=sys.stderr)
        return 2
    try:
        line = check_run_dir(args[0])
    except UserError as exc:
        print(f"llmctl: preflight: {exc}", file=sys.stderr)
        return 2
    if line:
        print(f"llmctl: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
