"""Hostfile parsing: order, slots, comments, and one-line errors naming file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmctl.errors import UserError
from llmctl.launch.hostfile import Host, parse_hostfile, read_hostfile


def test_hosts_in_order_with_slots_and_comments() -> None:
    text = "# cluster\nnode-001 slots=8\n\n  10.0.0.7   # by address\nnode-003 slots=4 # x\n"
    assert parse_hostfile(text) == (
        Host(name="node-001", slots=8),
        Host(name="10.0.0.7", slots=None),
        Host(name="node-003", slots=4),
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a\na\n", "f:2: host 'a' listed twice"),
        ("a slots=x\n", "f:1: expected 'HOST' or 'HOST slots=N'"),
        ("a slots=0\n", "f:1: slots must be >= 1"),
        ("a b\n", "f:1: expected"),
        ("-oProxyCommand=x\n", "f:1: '-oProxyCommand=x' is not a host name"),
        ("# only a comment\n\n", "f: no hosts listed"),
    ],
)
def test_bad_lines_are_one_line_errors(text: str, needle: str) -> None:
    with pytest.raises(UserError) as err:
        parse_hostfile(text, "f")
    assert needle in err.value.message
    assert "\n" not in err.value.message


def test_missing_file_names_path_and_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"hostfile .*nope cannot be read.*launcher.hostfile"):
        read_hostfile(tmp_path / "nope")
