"""The lost-node decision of the torchrun launcher (pure parts)."""

from __future__ import annotations

from llmctl.launch.torchrun import SSH_LOST, NodeCommand, _Rejoins, node_max_restarts


def _node(rank: int, restarts: int) -> NodeCommand:
    return NodeCommand(
        host=f"h{rank}", node_rank=rank, argv=("torchrun", f"--max-restarts={restarts}")
    )


def test_max_restarts_is_read_from_the_rendered_command() -> None:
    assert node_max_restarts(_node(1, 2)) == 2
    assert node_max_restarts(NodeCommand(host="h", node_rank=1, argv=("torchrun",))) == 0


def test_only_a_lost_non_rendezvous_node_with_restarts_left_is_brought_back() -> None:
    rejoins = _Rejoins(used=[0, 0])
    assert rejoins.wanted(1, _node(1, 1), SSH_LOST, any_done=False)
    assert not rejoins.wanted(0, _node(0, 1), SSH_LOST, any_done=False)  # hosts the store
    assert not rejoins.wanted(1, _node(1, 1), 1, any_done=False)  # an ordinary failure
    assert not rejoins.wanted(1, _node(1, 0), SSH_LOST, any_done=False)  # no restarts allowed
    assert not rejoins.wanted(1, _node(1, 1), SSH_LOST, any_done=True)  # a node already finished
    rejoins.used[1] = 1
    assert not rejoins.wanted(1, _node(1, 1), SSH_LOST, any_done=False)  # budget spent
