"""Hostfiles for the bare-metal torchrun launcher.

One host per line, optionally followed by `slots=N` (processes the host can run), as in the
MPI/DeepSpeed convention; `#` starts a comment; blank lines are ignored:

    # two nodes, 8 GPUs each
    node-001 slots=8
    node-002 slots=8

The first host is node 0 and hosts the rendezvous store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UserError

_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?)$")
_SLOTS_RE = re.compile(r"^slots=(\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """One hostfile entry: a name (or address) reachable over ssh, and its slots if given."""

    name: str
    slots: int | None = None


def parse_hostfile(text: str, source: str = "hostfile") -> tuple[Host, ...]:
    """Parse hostfile text.

    Args:
        text: The file's contents.
        source: Name used in error messages (usually the path).

    Returns:
        The hosts in file order.

    Raises:
        UserError: A malformed line, a duplicate host, bad slots, or no host at all.
    """
    hosts: list[Host] = []
    seen: set[str] = set()
    for num, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *rest = line.split()
        if not _HOST_RE.match(name):
            raise UserError(f"{source}:{num}: {name!r} is not a host name or address")
        if name in seen:
            raise UserError(f"{source}:{num}: host {name!r} listed twice")
        slots = _parse_slots(rest, f"{source}:{num}")
        seen.add(name)
        hosts.append(Host(name=name, slots=slots))
    if not hosts:
        raise UserError(f"{source}: no hosts listed (one host name per line)")
    return tuple(hosts)


def _parse_slots(fields: list[str], where: str) -> int | None:
    if not fields:
        return None
    match = _SLOTS_RE.match(fields[0]) if len(fields) == 1 else None
    if match is None:
        raise UserError(
            f"{where}: expected 'HOST' or 'HOST slots=N', got extra {' '.join(fields)!r}"
        )
    slots = int(match.group(1))
    if slots < 1:
        raise UserError(f"{where}: slots must be >= 1, got {slots}")
    return slots


def read_hostfile(path: str | Path) -> tuple[Host, ...]:
    """Read and parse a hostfile.

    Raises:
        UserError: The file is missing or unreadable, or malformed.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UserError(
            f"hostfile {p} cannot be read ({exc.strerror}); set launcher.hostfile to a file "
            "listing one host per line"
        ) from None
    return parse_hostfile(text, str(p))


def drop_excluded(hosts: tuple[Host, ...], run_dir: str | Path) -> tuple[Host, ...]:
    """The hosts without those the straggler policy `exclude` recorded for this run directory
    (RUN_DIR/excluded_hosts.json, `llmctl.run.straggler`); one line on stderr names them.

    Delete that file (or a host's entry) to use a host again."""
    import sys

    from llmctl.run.straggler import EXCLUDED_HOSTS_FILE, excluded_hosts, is_excluded

    excluded = excluded_hosts(Path(run_dir))
    if not excluded:
        return hosts
    kept = tuple(h for h in hosts if not is_excluded(h.name, excluded))
    if len(kept) < len(hosts):
        skipped = ", ".join(h.name for h in hosts if h not in kept)
        print(
            f"llmctl: skipping host(s) {skipped}: excluded as stragglers in "
            f"{Path(run_dir) / EXCLUDED_HOSTS_FILE}",
            file=sys.stderr,
            flush=True,
        )
    return kept
