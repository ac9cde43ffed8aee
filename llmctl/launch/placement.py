"""`python -m llmctl.launch.placement RUN_DIR`: a SLURM job's nodes against its plan.

The sbatch script runs this in the batch shell before srun starts any rank (and after an
elastic re-plan, so it checks the layout the ranks will run). It reads the nodes granted
(`SLURM_JOB_NODELIST`) and the leaf switches SLURM knows (`scontrol show topology`, the
Level=0 switches of `TopologyPlugin=topology/tree`), ranks the nodes as torchrun will, and
applies `plan.placement.check`. With `launcher.placement=strict` (the default) a job spread
over more leaf switches than the plan assumed exits 2 with one line, before any rank
starts, so a step time priced on a non-blocking network is never run silently on a
spread allocation; `warn` prints the line and runs. Without a switch topology there is
nothing to check: one line says so and the job runs.

`--switches=K` (rendered when `cluster.nodes_per_switch` is set) makes SLURM wait for such an
allocation; SLURM gives up waiting after `max_switch_wait` (or `launcher.slurm_switch_wait`)
and starts the job spread, which is the case this check stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.errors import UserError
from llmctl.plan.placement import Verdict, check, placement_of
from llmctl.topology.slurm import expand_nodelist

if TYPE_CHECKING:
    from llmctl.config.schema import RootConfig

USAGE = "usage: python -m llmctl.launch.placement RUN_DIR"


def parse_topology(text: str) -> dict[str, str]:
    """host -> leaf switch from `scontrol show topology` (Level=0 switches; one line each,
    `SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[0-3]`)."""
    leaves: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("Level") != "0" or "SwitchName" not in fields or not fields.get("Nodes"):
            continue
        for host in expand_nodelist(fields["Nodes"]):
            leaves.setdefault(host, fields["SwitchName"])
    return leaves


def leaf_switches() -> dict[str, str]:
    """The cluster's leaf switches (`scontrol show topology`); empty without a topology.

    Raises:
        UserError: scontrol is missing or fails.
    """
    try:
        proc = subprocess.run(
            ["scontrol", "show", "topology"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"placement: scontrol show topology failed: {e}") from None
    if proc.returncode != 0:
        raise UserError(f"placement: scontrol show topology: {proc.stderr.strip()[:300]}")
    return parse_topology(proc.stdout)


def check_run(
    cfg: RootConfig, run_dir: Path, hosts: list[str], switch_of: dict[str, str]
) -> Verdict:
    """The run's layout (config.yaml and plan.json, as the ranks resolve it) placed on
    `hosts` under `switch_of`. The leaf size is `cluster.nodes_per_switch`, or when unset
    the largest leaf switch SLURM describes."""
    from llmctl.launch.common import launch_shape
    from llmctl.run.layout import resolve_layout
    from llmctl.run.rundir import read_plan

    plan = read_plan(run_dir)
    layout = resolve_layout(cfg, None, plan.layout if plan is not None else None)
    shape = launch_shape(cfg, layout, cfg.cluster.num_nodes)
    sizes: dict[str, int] = {}
    for switch in switch_of.values():
        sizes[switch] = sizes.get(switch, 0) + 1
    placement = placement_of(
        layout,
        nodes=cfg.cluster.num_nodes,
        gpus_per_node=shape.nproc_per_node,
        nvlink_domain_size=cfg.cluster.nvlink_domain_size,
        nodes_per_switch=cfg.cluster.nodes_per_switch,
    )
    if placement.nodes_per_switch is None:
        placement = replace(placement, nodes_per_switch=max(sizes.values()))
    return check(placement, hosts, switch_of)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the job may start, 2 (one line) when it must not."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    try:
        nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise UserError("placement: SLURM_JOB_NODELIST is not set (not inside a SLURM job)")
        switch_of = leaf_switches()
        if not switch_of:
            print(
                "llmctl: placement: SLURM describes no leaf switches (TopologyPlugin="
                "topology/tree with a topology.conf): not checked",
                file=sys.stderr,
                flush=True,
            )
            return 0
        from llmctl.config import load_resolved
        from llmctl.run.rundir import CONFIG_FILE

        cfg = load_resolved(run_dir / CONFIG_FILE)
        verdict = check_run(cfg, run_dir, expand_nodelist(nodelist), switch_of)
        how = str(cfg.launcher.placement)
    except UserError as e:
        print(f"llmctl: {e.message}", file=sys.stderr, flush=True)
        return 2
    except ValueError as e:  # a node list or topology SLURM wrote that does not parse
        print(f"llmctl: placement: {e}", file=sys.stderr, flush=True)
        return 2
    if verdict.ok:
        print(f"llmctl: placement: {verdict.line}", file=sys.stderr, flush=True)
        return 0
    if how == "warn":
        print(
            f"llmctl: placement: {verdict.line}; running anyway (launcher.placement=warn)",
            file=sys.stderr,
            flush=True,
        )
        return 0
    print(
        f"llmctl: placement: {verdict.line}; not starting (launcher.placement=warn runs anyway)",
        file=sys.stderr,
        flush=True,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
