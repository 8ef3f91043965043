"""The nodes table on both databases: registration, heartbeats, loss, drain, removal."""

from __future__ import annotations

import pytest

from agentenv.errors import Conflict
from agentenv.state import nodes as nodes_module
from agentenv.state.nodes import (
    NODE_TRANSITIONS,
    NodeCapacity,
    NodeEvent,
    NodeRegistry,
    NodeState,
    next_node_state,
)
from agentenv.state.sandboxes import open_engine


async def test_a_silent_node_is_lost_until_it_registers_again(
    state_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The registry's clock, moved by hand: a loaded machine cannot stretch its silences.
    clock = [1000.0]
    monkeypatch.setattr(nodes_module.time, "time", lambda: clock[0])
    engine = await open_engine(state_url)
    nodes = NodeRegistry(engine)
    try:
        await nodes.register("n1", "http://a:1", NodeCapacity(memory_mb=1000, layers=["L"]))
        await nodes.register("n2", "http://b:2", NodeCapacity())
        assert (
            await nodes.heartbeat("n1", NodeCapacity(memory_mb=1000, running=2)) == NodeState.ACTIVE
        )
        (n1,) = [n for n in await nodes.list() if n.name == "n1"]
        assert (n1.url, n1.capacity.running, n1.capacity.free_memory_mb) == ("http://a:1", 2, 1000)
        clock[0] += 0.3
        await nodes.heartbeat("n2", NodeCapacity())
        assert await nodes.declare_lost(timeout=0.2) == ["n1"]
        assert await nodes.declare_lost(timeout=0.2) == []  # once
        # A heartbeat does not revive a lost node: it has to start again.
        assert await nodes.heartbeat("n1", NodeCapacity()) == NodeState.LOST
        await nodes.register("n1", "http://a:1", NodeCapacity())
        assert (await nodes.get("n1")).state == NodeState.ACTIVE  # type: ignore[union-attr]
        assert await nodes.fire("n2", NodeEvent.DRAIN) == NodeState.DRAINING
        assert await nodes.heartbeat("n2", NodeCapacity()) == NodeState.DRAINING
        assert await nodes.remove("n2") and await nodes.get("n2") is None
        assert await nodes.heartbeat("n2", NodeCapacity()) is None
        assert await nodes.fire("nope", NodeEvent.ACTIVATE) is None
        # A lost node is not activated by hand: it has to start again.
        await nodes.fire("n1", NodeEvent.LOSE)
        with pytest.raises(Conflict, match="rejoins when it starts again"):
            await nodes.fire("n1", NodeEvent.ACTIVATE)
        assert (await nodes.get("n1")).state == NodeState.LOST  # type: ignore[union-attr]
    finally:
        await engine.dispose()


def test_the_node_table_answers_the_questions() -> None:
    assert [s for s in NodeState if s.places] == [NodeState.ACTIVE]
    assert [s for s in NodeState if s.keeps_movable] == [NodeState.ACTIVE]
    assert [s for s in NodeState if s.holds_sandboxes] == [NodeState.ACTIVE, NodeState.DRAINING]
    # Every state can be registered again and be lost; only a lost node cannot be activated.
    for state in NodeState:
        assert next_node_state("n", state, NodeEvent.REGISTER) is NodeState.ACTIVE
        assert next_node_state("n", state, NodeEvent.LOSE) is NodeState.LOST
    refused = {(s, e) for s in NodeState for e in NodeEvent} - set(NODE_TRANSITIONS)
    assert refused == {(NodeState.LOST, NodeEvent.DRAIN), (NodeState.LOST, NodeEvent.ACTIVATE)}
