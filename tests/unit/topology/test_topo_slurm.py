"""SLURM variables and compressed node lists."""

import pytest

from llmctl.errors import UserError
from llmctl.topology import expand_nodelist, probe_slurm


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("gpu5", ["gpu5"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("node[1-2],login[08-09]", ["node1", "node2", "login08", "login09"]),
        ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
        ("a,b-c[0],d", ["a", "b-c0", "d"]),
    ],
)
def test_expand_nodelist(spec: str, hosts: list[str]) -> None:
    assert expand_nodelist(spec) == hosts


@pytest.mark.parametrize("spec", ["node[01-04", "node]1[", "node[4-1]", "node[a-b]", "n[[1]]"])
def test_bad_nodelists(spec: str) -> None:
    with pytest.raises(ValueError, match="nodelist"):
        expand_nodelist(spec)


def test_outside_a_job() -> None:
    assert probe_slurm({"PATH": "/usr/bin"}) is None


def test_inside_a_job() -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "5",
        "SLURM_JOB_NODELIST": "node[01-04,07]",
        "SLURM_GPUS_ON_NODE": "8",
    }
    info = probe_slurm(env)
    assert info is not None
    assert (info.job_id, info.num_nodes, info.gpus_on_node) == ("4242", 5, 8)
    assert info.nodes == ("node01", "node02", "node03", "node04", "node07")


def test_older_variable_names() -> None:
    info = probe_slurm({"SLURM_JOBID": "7", "SLURM_NNODES": "2", "SLURM_NODELIST": "c[1-2]"})
    assert info is not None and info.num_nodes == 2 and info.nodes == ("c1", "c2")
    assert info.gpus_on_node is None


def test_bad_variables_are_user_errors() -> None:
    with pytest.raises(UserError, match="SLURM_JOB_NUM_NODES='two': expected an integer"):
        probe_slurm({"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "two"})
    with pytest.raises(UserError, match=r"SLURM_JOB_NODELIST: .*range"):
        probe_slurm({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[3-1]"})
