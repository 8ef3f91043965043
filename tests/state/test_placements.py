"""The placement ledger on both databases: what counts against a node, and until when."""

from __future__ import annotations

import pytest

from agentenv.state import placements as ledger_module
from agentenv.state.nodes import NodeCapacity, NodeRegistry
from agentenv.state.placements import Placement, PlacementLedger
from agentenv.state.sandboxes import open_engine


async def test_placements_count_until_a_later_heartbeat(
    state_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("time.time", lambda: clock[0])  # the ledger's and the nodes'

    engine = await open_engine(state_url)
    nodes, ledger = NodeRegistry(engine), PlacementLedger(engine)
    try:
        await nodes.register("n1", "http://n1", NodeCapacity(memory_mb=4096))
        await nodes.register("n2", "http://n2", NodeCapacity(memory_mb=4096))
        in_flight = await ledger.reserve("n1", 512, 2)
        settled = await ledger.reserve("n1", 256, 1)
        refused = await ledger.reserve("n2", 1024, 1)
        await ledger.settle(settled)
        await ledger.release(refused)
        assert sorted(await ledger.outstanding(), key=lambda p: p.memory_mb) == [
            Placement(settled, "n1", 256, 1),
            Placement(in_flight, "n1", 512, 2),
        ]

        async def beat_after(seconds: float) -> None:
            clock[0] += seconds
            await nodes.heartbeat("n1", NodeCapacity(memory_mb=4096))

        # A heartbeat within the margin may have been taken before the node stored it.
        await beat_after(ledger_module.SETTLE_MARGIN / 2)
        assert sorted(await ledger.outstanding(), key=lambda p: p.memory_mb) == [
            Placement(settled, "n1", 256, 1),
            Placement(in_flight, "n1", 512, 2),
        ]
        await beat_after(ledger_module.SETTLE_MARGIN)
        assert await ledger.outstanding() == [Placement(in_flight, "n1", 512, 2)]
        assert await ledger.forget_reflected() == 1
        # One nobody settled stops counting once abandoned, and is forgotten then.
        clock[0] += ledger_module.ABANDONED_AFTER + 1
        assert await ledger.outstanding() == []
        assert await ledger.forget_reflected() == 1
        await ledger.settle(in_flight)  # gone already: nothing to do
    finally:
        await engine.dispose()


async def test_a_heartbeat_written_late_counts_from_when_it_was_taken(
    state_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded node may write a report seconds after it read what it holds: a placement
    settled in between is not in the report, so it still counts."""
    clock = [1000.0]
    monkeypatch.setattr("time.time", lambda: clock[0])

    engine = await open_engine(state_url)
    nodes, ledger = NodeRegistry(engine), PlacementLedger(engine)
    try:
        await nodes.register("n1", "http://n1", NodeCapacity(memory_mb=4096))
        taken_at = clock[0] + 1
        clock[0] += 2
        settled = await ledger.reserve("n1", 256, 1)
        await ledger.settle(settled)
        clock[0] += 3
        await nodes.heartbeat("n1", NodeCapacity(memory_mb=4096), taken_at)
        assert await ledger.outstanding() == [Placement(settled, "n1", 256, 1)]
        node = await nodes.get("n1")
        assert node is not None and node.silent_for(clock[0]) == 4
    finally:
        await engine.dispose()
