"""Renderings pinned by golden files, and the errors raised before anything runs."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

import pytest

from llmctl.errors import UserError
from llmctl.launch.hostfile import parse_hostfile
from llmctl.launch.local import render_local, render_local_env, shell_line
from llmctl.launch.slurm import render_sbatch
from llmctl.launch.torchrun import render_torchrun_nodes

RUN_DIR = "/runs/golden run"  # a space on purpose: every path must be quoted

Make = Callable[..., Any]
GPU = (
    "cluster.device=cuda",
    "cluster.gpus_per_node=8",
    "cluster.num_nodes=2",
    "cluster.cpu_cores=96",
)


def _nodes_text(nodes: list[Any]) -> str:
    out = []
    for n in nodes:
        out += [f"# node {n.node_rank} on {n.host}", shlex.join(n.ssh_argv), ""]
    return "\n".join(out)


def test_local_golden(make_cfg: Make, golden: Callable[[str, str], None]) -> None:
    cfg = make_cfg("parallel.dp=2")
    golden("local_cpu_dp2.sh", shell_line(render_local(cfg, RUN_DIR), render_local_env(cfg)) + "\n")


def test_torchrun_two_nodes_golden(make_cfg: Make, golden: Callable[[str, str], None]) -> None:
    cfg = make_cfg(
        "parallel.dp=4", "parallel.micro_batch_size=1", "cluster.num_nodes=2",
        secrets=["WANDB_API_KEY"], ssh_options=["-F", "/etc/llmctl/ssh config"],
        ssh_user="ubuntu", max_restarts=1,
    )  # fmt: skip
    hosts = parse_hostfile("node-a slots=2\nnode-b slots=2\nnode-c\n")
    nodes = render_torchrun_nodes(cfg, RUN_DIR, hosts)
    assert [n.host for n in nodes] == ["node-a", "node-b"]  # num_nodes hosts, file order
    assert all("--rdzv-endpoint=node-a:29500" in n.argv for n in nodes)
    golden("torchrun_2nodes.txt", _nodes_text(nodes))


def test_sbatch_cpu_golden(make_cfg: Make, golden: Callable[[str, str], None]) -> None:
    golden("slurm_cpu_1node.sbatch", render_sbatch(make_cfg("parallel.dp=2"), RUN_DIR))


def test_sbatch_gpu_golden(make_cfg: Make, golden: Callable[[str, str], None]) -> None:
    cfg = make_cfg(
        *GPU, "parallel.dp=16", "parallel.micro_batch_size=1", "train.global_batch_size=32",
        "precision=bf16",
        slurm_partition="batch", slurm_account="proj x", slurm_job_name="llama run",
        secrets=["WANDB_API_KEY", "HF_TOKEN"], env={"NCCL_IB_HCA": "mlx5_0,mlx5_1"},
        slurm_extra=["--exclusive"], slurm_signal="USR2@120", max_restarts=2,
    )  # fmt: skip
    text = render_sbatch(cfg, RUN_DIR)
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --nodes=2" in text
    golden("slurm_gpu_2nodes.sbatch", text)


def test_secret_values_never_rendered(make_cfg: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "sk-very-secret-value")
    cfg = make_cfg("parallel.dp=2", "cluster.num_nodes=2", secrets=["WANDB_API_KEY"])
    hosts = parse_hostfile("a\nb\n")
    texts = [
        render_sbatch(cfg, RUN_DIR),
        *(n.remote_command for n in render_torchrun_nodes(cfg, RUN_DIR, hosts)),
    ]
    for text in texts:
        assert "WANDB_API_KEY" in text
        assert "sk-very-secret-value" not in text


@pytest.mark.parametrize(
    ("overrides", "launcher", "needle"),
    [
        (
            (
                "parallel.dp=3",
                "train.global_batch_size=6",
                "parallel.micro_batch_size=1",
                "cluster.num_nodes=2",
            ),
            {},
            "not divisible over 2 nodes",
        ),
        (("parallel.dp=2",), {"nproc_per_node": 4}, "launcher.nproc_per_node=4 x 1 node(s) = 4"),
        (
            (*GPU, "parallel.dp=32", "train.global_batch_size=32", "parallel.micro_batch_size=1"),
            {},
            "16 ranks per node",
        ),
        (("parallel.dp=2",), {"slurm_time": "1 hour"}, "launcher.slurm_time='1 hour'"),
        (("parallel.dp=2",), {"slurm_signal": "TERM@60"}, "use USR1 or USR2"),
        (("parallel.dp=2",), {"slurm_job_name": "it's"}, "launcher.slurm_job_name"),
        (("parallel.dp=2",), {"slurm_extra": ["exclusive"]}, "must be one --option"),
        (("parallel.dp=2",), {"env": {"A": "1"}, "secrets": ["A"]}, "both in launcher.secrets"),
        (("parallel.dp=2",), {"secrets": ["not a name"]}, "is not a variable name"),
    ],
)
def test_sbatch_refuses_bad_input(make_cfg: Make, overrides: tuple[str, ...],
                                  launcher: dict[str, Any], needle: str) -> None:  # fmt: skip
    with pytest.raises(UserError) as err:
        render_sbatch(make_cfg(*overrides, **launcher), RUN_DIR)
    assert needle in err.value.message


def test_local_refuses_several_nodes(make_cfg: Make) -> None:
    with pytest.raises(UserError, match="launcher=local starts processes on this node only"):
        render_local(make_cfg("cluster.num_nodes=2", "parallel.dp=2"), RUN_DIR)


def test_torchrun_refuses_short_hostfile_and_small_slots(make_cfg: Make) -> None:
    cfg = make_cfg("parallel.dp=4", "parallel.micro_batch_size=1", "cluster.num_nodes=2")
    with pytest.raises(UserError, match="lists 1 host"):
        render_torchrun_nodes(cfg, RUN_DIR, parse_hostfile("a\n"))
    with pytest.raises(UserError, match="host b has slots=1 but each node runs 2 ranks"):
        render_torchrun_nodes(cfg, RUN_DIR, parse_hostfile("a\nb slots=1\n"))


def test_layout_world_size_follows_parallel_degrees(make_cfg: Make) -> None:
    argv = render_local(make_cfg("parallel.dp=2", "parallel.pp=2"), RUN_DIR)
    assert "--nproc-per-node=4" in argv


def test_sbatch_asks_for_the_planned_leaf_switches(make_cfg: Make) -> None:
    """cluster.nodes_per_switch: `--switches` = the fewest leaf switches that hold the
    nodes (the plan's non-blocking network), with the wait asked for; the batch shell checks
    the nodes granted before srun; placement=off renders neither."""
    many = (*GPU[:2], "cluster.num_nodes=6", "parallel.dp=48", "train.global_batch_size=48")
    cfg = make_cfg(*many, "parallel.micro_batch_size=1", "cluster.nodes_per_switch=4",
                   slurm_switch_wait="10:00")  # fmt: skip
    text = render_sbatch(cfg, RUN_DIR)
    assert "#SBATCH --switches=2@10:00\n" in text
    check = [ln for ln in text.splitlines() if "llmctl.launch.placement" in ln]
    assert len(check) == 1 and shlex.quote(RUN_DIR) in check[0] and "exit 2" in check[0]
    assert text.index("llmctl.launch.placement") < text.index("srun --kill-on-bad-exit")
    cfg = make_cfg(*many, "parallel.micro_batch_size=1", "cluster.nodes_per_switch=8")
    assert "#SBATCH --switches=1\n" in render_sbatch(cfg, RUN_DIR)  # SLURM's own wait
    cfg = make_cfg(*many, "parallel.micro_batch_size=1", "cluster.nodes_per_switch=4",
                   placement="off")  # fmt: skip
    text = render_sbatch(cfg, RUN_DIR)
    assert "--switches" not in text and "llmctl.launch.placement" not in text
    one = render_sbatch(make_cfg("parallel.dp=2", "cluster.nodes_per_switch=4"), RUN_DIR)
    assert "--switches" not in one and "llmctl.launch.placement" not in one  # one node
    with pytest.raises(UserError, match=r"launcher.slurm_switch_wait='soon' is not"):
        bad = make_cfg(*many, "parallel.micro_batch_size=1", "cluster.nodes_per_switch=4",
                       slurm_switch_wait="soon")  # fmt: skip
        render_sbatch(bad, RUN_DIR)
