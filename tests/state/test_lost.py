"""Lost sandboxes on both databases: recorded with the loss of their row, kept a week."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from agentenv.state import lost as lost_module
from agentenv.state import nodes as nodes_module
from agentenv.state.lifecycle import State
from agentenv.state.lost import LostSandboxes
from agentenv.state.nodes import NodeCapacity, NodeRegistry, NodeState
from agentenv.state.sandboxes import SandboxRecord, SqlSandboxStore, open_engine

START = datetime(2026, 1, 1, tzinfo=UTC)
BASE = SandboxRecord("x", "base", State.PAUSED, START, START + timedelta(hours=1), 1, 256,
                     4096, 0, metadata={"run": "7"})  # fmt: skip


async def test_a_forgotten_sandbox_is_recorded_lost_then_pruned(
    state_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await open_engine(state_url)
    node = SqlSandboxStore(engine, "n1")
    control = SqlSandboxStore(engine, node="")
    lost = LostSandboxes(engine)
    try:
        await node.insert(BASE)
        stale = dataclasses.replace(BASE, state=State.RUNNING)
        assert await control.forget([stale]) == []  # it changed meanwhile: nothing happens
        assert await lost.list() == []
        assert await control.forget([BASE]) == ["x"]
        assert await node.get("x") is None
        gone = await lost.get("x")
        assert gone is not None and gone.metadata == {"run": "7"}
        assert (gone.node, gone.state) == ("n1", "paused")
        assert "had not reached the object store" in gone.message
        assert await lost.prune() == 0
        later = gone.lost_at + lost_module.KEPT_FOR + 1
        monkeypatch.setattr(lost_module.time, "time", lambda: later)
        assert await lost.prune() == 1
        assert await lost.get("x") is None
    finally:
        await engine.dispose()


async def test_a_node_is_declared_lost_with_its_sandboxes_forgotten_in_one_transaction(
    state_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What settles a node's loss runs in the transaction that declares it: if it fails,
    the node is not lost either; once it passes, no reader sees the node lost with its
    sandboxes still listed."""
    clock = [1000.0]
    monkeypatch.setattr(nodes_module.time, "time", lambda: clock[0])
    engine = await open_engine(state_url)
    nodes = NodeRegistry(engine)
    node = SqlSandboxStore(engine, "n1")
    control = SqlSandboxStore(engine, node="")
    try:
        await nodes.register("n1", "http://a:1", NodeCapacity())
        await node.insert(dataclasses.replace(BASE, state=State.RUNNING))
        clock[0] += 1

        async def failing(connection: AsyncConnection, lost: list[str]) -> None:
            await control.forget(await control.on_nodes(lost, connection), connection)
            raise RuntimeError("the store went away")

        with pytest.raises(RuntimeError):
            await nodes.declare_lost(0.5, failing)
        assert (await nodes.get("n1")).state == NodeState.ACTIVE  # type: ignore[union-attr]
        assert [r.sandbox_id for r in await node.list()] == ["x"]

        async def forget(connection: AsyncConnection, lost: list[str]) -> None:
            assert lost == ["n1"]
            await control.forget(await control.on_nodes(lost, connection), connection)

        assert await nodes.declare_lost(0.5, forget) == ["n1"]
        assert await node.list() == []
        assert (await LostSandboxes(engine).get("x")) is not None
    finally:
        await engine.dispose()
