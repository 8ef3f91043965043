"""Lost sandboxes on both databases: recorded with the loss of their row, kept a week."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from agentenv.state import lost as lost_module
from agentenv.state.lifecycle import State
from agentenv.state.lost import LostSandboxes
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
