"""The SLURM job we run in, from its environment variables.

SLURM writes node lists in a compressed hostlist form: `node[01-04,07]` is node01..node04 and
node07 (zero padding kept), several bracket groups multiply (`r[1-2]n[1-2]` is four hosts) and
top-level commas separate host expressions. `expand_nodelist` implements that grammar so that
no `scontrol show hostnames` subprocess is needed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from llmctl.errors import UserError
from llmctl.topology.model import SlurmInfo

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(spec: str) -> list[str]:
    """Expand a SLURM hostlist expression into host names, in order.

    Args:
        spec: e.g. "node[01-04,07],gpu5".

    Returns:
        The host names, e.g. ["node01", "node02", "node03", "node04", "node07", "gpu5"].

    Raises:
        ValueError: unbalanced brackets or a range that is not `a` or `a-b` with a <= b.
    """
    return [host for expr in _split_top_level(spec) for host in _expand_one(expr)]


def _split_top_level(spec: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in spec.strip():
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in nodelist {spec!r}")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth != 0:
        raise ValueError(f"unbalanced brackets in nodelist {spec!r}")
    return [p for p in [*parts, current] if p]


def _expand_one(expr: str) -> list[str]:
    pieces = re.split(r"\[([^\]]*)\]", expr)
    if "[" in "".join(pieces[0::2]) or "]" in "".join(pieces[0::2]):
        raise ValueError(f"unbalanced brackets in nodelist {expr!r}")
    choices = [[p] if i % 2 == 0 else _expand_ranges(p, expr) for i, p in enumerate(pieces)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if m is None:
            raise ValueError(f"bad range {item!r} in nodelist {expr!r}; expected N or N-M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in nodelist {expr!r}")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def probe_slurm(env: Mapping[str, str]) -> SlurmInfo | None:
    """Read the SLURM job from environment variables; None outside a SLURM job.

    Uses SLURM_JOB_ID, SLURM_JOB_NUM_NODES (or SLURM_NNODES), SLURM_JOB_NODELIST (or
    SLURM_NODELIST) and SLURM_GPUS_ON_NODE.

    Raises:
        UserError: a variable that SLURM would never write (non-integer count, bad nodelist).
    """
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        nodes = tuple(expand_nodelist(nodelist)) if nodelist else ()
    except ValueError as e:
        raise UserError(f"SLURM_JOB_NODELIST: {e}") from None
    count = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    num_nodes = _int_var("SLURM_JOB_NUM_NODES", count) if count else max(len(nodes), 1)
    gpus = env.get("SLURM_GPUS_ON_NODE")
    gpus_on_node = _int_var("SLURM_GPUS_ON_NODE", gpus) if gpus else None
    return SlurmInfo(job_id=job_id, num_nodes=num_nodes, nodes=nodes, gpus_on_node=gpus_on_node)


def _int_var(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{name}={value!r}: expected an integer") from None
