"""The nodes table on both databases: registration, heartbeats, loss, drain, removal."""

from __future__ import annotations

import asyncio

from agentenv.state.nodes import ACTIVE, DRAINING, LOST, NodeCapacity, NodeRegistry
from agentenv.state.sandboxes import open_engine


async def test_a_silent_node_is_lost_until_it_registers_again(state_url: str) -> None:
    engine = await open_engine(state_url)
    nodes = NodeRegistry(engine)
    try:
        await nodes.register("n1", "http://a:1", NodeCapacity(memory_mb=1000, layers=["L"]))
        await nodes.register("n2", "http://b:2", NodeCapacity())
        assert await nodes.heartbeat("n1", NodeCapacity(memory_mb=1000, running=2)) == ACTIVE
        (n1,) = [n for n in await nodes.list() if n.name == "n1"]
        assert (n1.url, n1.capacity.running, n1.capacity.free_memory_mb) == ("http://a:1", 2, 1000)
        await asyncio.sleep(0.3)
        await nodes.heartbeat("n2", NodeCapacity())
        assert await nodes.declare_lost(timeout=0.2) == ["n1"]
        assert await nodes.declare_lost(timeout=0.2) == []  # once
        # A heartbeat does not revive a lost node: it has to start again.
        assert await nodes.heartbeat("n1", NodeCapacity()) == LOST
        await nodes.register("n1", "http://a:1", NodeCapacity())
        assert (await nodes.get("n1")).state == ACTIVE  # type: ignore[union-attr]
        assert await nodes.set_state("n2", DRAINING)
        assert await nodes.heartbeat("n2", NodeCapacity()) == DRAINING
        assert await nodes.remove("n2") and await nodes.get("n2") is None
        assert await nodes.heartbeat("n2", NodeCapacity()) is None
        assert not await nodes.set_state("nope", ACTIVE)
    finally:
        await engine.dispose()
