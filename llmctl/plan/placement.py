"""Where a layout's ranks must sit for its step time to hold, and whether an allocation does.

The step-time model (`plan/perf.py`) prices a group of consecutive ranks at NVLink speed when
it spans at most one NVLink domain, and at the full inter-node bandwidth of every GPU's NIC
otherwise: a non-blocking network. Ranks are numbered as megatron-core numbers them
(tp-cp-ep-dp-pp: TP fastest, PP slowest) and placed node by node, so rank r sits on node
r // gpus_per_node, and each pipeline stage is one block of consecutive nodes whose
data-parallel reduce-scatter and all-gather carry most of the inter-node traffic; pipeline
stages exchange only activations with their neighbours.

A real network is non-blocking only under one leaf switch (a DGX SuperPOD scalable unit is 32
nodes on one rail-optimised leaf group): traffic between leaves shares uplinks. So the
assumptions the plan made become two constraints on an allocation:

- the job uses the fewest leaf switches that hold its nodes (`switches`, SLURM's
  `--switches`), and
- each pipeline stage's nodes share leaf switches: a stage of at most `nodes_per_switch`
  nodes sits under one switch, a larger one under ceil(stage / nodes_per_switch).

`check` applies them to a real allocation: node names in the order torchrun's c10d
rendezvous gives them ranks (sorted by host name; `torch.distributed.elastic`'s
`_RendezvousState` sorts its participants) and each node's leaf switch.
Pure: stdlib only, frozen values in and out.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from llmctl.plan.layout import Layout
from llmctl.plan.specs import ClusterSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """The placement one layout on `nodes` nodes assumes (see the module text)."""

    nodes: int
    gpus_per_node: int
    nvlink_domain_size: int
    nvlink_groups: tuple[str, ...]
    """Groups priced at NVLink speed, e.g. 'TP 4 (ranks 0-3, ...)'."""
    network_groups: tuple[str, ...]
    """Groups priced over the inter-node network."""
    stage_nodes: tuple[tuple[int, ...], ...]
    """Node indices of each pipeline stage, in rank order (a node may hold several stages)."""
    nodes_per_switch: int | None
    """Nodes under one leaf switch; None = the cluster file does not say."""

    @property
    def switches(self) -> int | None:
        """Leaf switches the job should span (SLURM `--switches`); None when unknown."""
        if self.nodes_per_switch is None:
            return None
        return ceil(self.nodes / self.nodes_per_switch)

    def stage_switches(self, stage: int) -> int | None:
        """Leaf switches one pipeline stage's nodes may span; None when unknown."""
        if self.nodes_per_switch is None:
            return None
        return ceil(len(self.stage_nodes[stage]) / self.nodes_per_switch)

    def lines(self) -> list[str]:
        """What `plan --explain` prints."""
        out = [
            f"{self.nodes} node(s) of {self.gpus_per_node}; rank r on node r // "
            f"{self.gpus_per_node} (megatron-core order tp-cp-ep-dp-pp)",
            "inside one NVLink domain "
            f"({self.nvlink_domain_size} GPUs): " + (", ".join(self.nvlink_groups) or "nothing"),
            "over the network: " + (", ".join(self.network_groups) or "nothing"),
        ]
        stages = [
            f"{i}: node{'s' if len(n) > 1 else ''} {_span(n)}"
            for i, n in enumerate(self.stage_nodes)
        ]
        out.append("pipeline stages: " + "; ".join(stages))
        if self.nodes_per_switch is None:
            out.append(
                "leaf switches: not stated (cluster.nodes_per_switch); no --switches asked for"
            )
        else:
            out.append(
                f"leaf switches: {self.switches} ({self.nodes_per_switch} nodes each; SLURM "
                f"--switches={self.switches}); each stage's nodes under one switch"
                + (
                    ""
                    if all(len(n) <= self.nodes_per_switch for n in self.stage_nodes)
                    else " (or the fewest that hold it)"
                )
            )
        return out


def _span(nodes: tuple[int, ...]) -> str:
    return str(nodes[0]) if len(nodes) == 1 else f"{nodes[0]}-{nodes[-1]}"


def placement_of(
    layout: Layout,
    *,
    nodes: int,
    gpus_per_node: int,
    nvlink_domain_size: int,
    nodes_per_switch: int | None = None,
) -> Placement:
    """The placement `layout` assumes on `nodes` nodes of `gpus_per_node` ranks each.

    Raises:
        ValueError: The layout's world size is not nodes * gpus_per_node, or a count < 1.
    """
    if nodes < 1 or gpus_per_node < 1 or nvlink_domain_size < 1:
        raise ValueError("nodes, gpus_per_node and nvlink_domain_size must be >= 1")
    if nodes_per_switch is not None and nodes_per_switch < 1:
        raise ValueError(f"nodes_per_switch must be >= 1, got {nodes_per_switch}")
    world = nodes * gpus_per_node
    lay = layout
    if lay.tp * lay.cp * lay.dp * lay.pp != world:
        raise ValueError(
            f"layout {lay.tp}x{lay.cp}x{lay.dp}x{lay.pp} (TPxCPxDPxPP) is "
            f"{lay.tp * lay.cp * lay.dp * lay.pp} ranks, not {nodes} x {gpus_per_node}"
        )
    groups = [("TP", lay.tp, lay.tp), ("CP", lay.cp, lay.tp * lay.cp)]
    if lay.ep > 1:
        groups.append(("EP", lay.ep, (lay.etp or lay.tp) * lay.ep))
    groups.append(("DP", lay.dp, lay.tp * lay.cp * lay.dp))
    inside: list[str] = []
    network: list[str] = []
    for name, size, span in groups:
        if size <= 1:
            continue
        where = f"{name} {size} (spans {span} ranks)"
        (inside if span <= nvlink_domain_size else network).append(where)
    stage_ranks = world // lay.pp
    stage_nodes = tuple(
        tuple(
            range(
                (s * stage_ranks) // gpus_per_node, ((s + 1) * stage_ranks - 1) // gpus_per_node + 1
            )
        )
        for s in range(lay.pp)
    )
    if lay.pp > 1:
        where = f"PP {lay.pp} (neighbouring stages)"
        # perf prices the stage-to-stage sends over the whole pipeline's span
        (network if world > nvlink_domain_size else inside).append(where)
    return Placement(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nvlink_domain_size=nvlink_domain_size,
        nvlink_groups=tuple(inside),
        network_groups=tuple(network),
        stage_nodes=stage_nodes,
        nodes_per_switch=nodes_per_switch,
    )


def placement_for(cluster: ClusterSpec, layout: Layout) -> Placement | None:
    """The placement of `layout` on `cluster` (None when its world size is not the cluster's)."""
    try:
        return placement_of(
            layout,
            nodes=cluster.num_nodes,
            gpus_per_node=cluster.gpus_per_node,
            nvlink_domain_size=cluster.nvlink_domain_size,
            nodes_per_switch=cluster.nodes_per_switch,
        )
    except ValueError:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """An allocation against a placement: `ok`, and one line saying why (or what it is)."""

    ok: bool
    line: str


def check(placement: Placement, hosts: list[str], switch_of: dict[str, str]) -> Verdict:
    """Whether the allocation `hosts` (any order; ranked as torchrun ranks them: sorted by
    name) under the leaf switches `switch_of` (host -> switch name) holds `placement`.

    A host with no switch fails: the scheduler placed a node the topology does not describe.

    Raises:
        ValueError: `placement.nodes_per_switch` is None (take it from the topology first).
    """
    if placement.nodes_per_switch is None or placement.switches is None:
        raise ValueError("check needs placement.nodes_per_switch")
    if len(hosts) != placement.nodes:
        return Verdict(
            ok=False, line=f"{len(hosts)} node(s) allocated, the plan is for {placement.nodes}"
        )
    ranked = sorted(hosts)
    missing = [h for h in ranked if h not in switch_of]
    if missing:
        return Verdict(ok=False, line=f"node(s) {', '.join(missing)} are under no leaf switch")
    used = sorted({switch_of[h] for h in ranked})
    want = placement.switches
    if len(used) > want:
        return Verdict(
            ok=False,
            line=f"{len(ranked)} node(s) span {len(used)} leaf switches ({', '.join(used)}); "
            f"the plan assumed {want}",
        )
    for s, nodes in enumerate(placement.stage_nodes):
        names = [ranked[i] for i in nodes]
        under = sorted({switch_of[h] for h in names})
        limit = ceil(len(nodes) / placement.nodes_per_switch)
        if len(under) > limit:
            return Verdict(
                ok=False,
                line=f"pipeline stage {s} (nodes {', '.join(names)}) spans leaf switches "
                f"{', '.join(under)}; the plan priced its data-parallel traffic inside "
                f"{limit} switch{'es' if limit > 1 else ''}",
            )
    return Verdict(
        ok=True,
        line=f"{len(ranked)} node(s) under {len(used)} leaf switch"
        f"{'es' if len(used) > 1 else ''} ({', '.join(used)}), each pipeline stage under "
        "the switches the plan assumed",
    )
