"""A node takes a lost node's stored paused sandbox, and nothing else."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentenv.errors import Conflict, NotFound
from agentenv.runtime.node.adoption import adopt
from agentenv.state.lifecycle import State
from agentenv.state.nodes import NodeCapacity, NodeEvent, NodeRegistry
from agentenv.state.sandboxes import SqlSandboxStore

from .fakes import Harness, make_harness


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    yield harness
    await harness.manager.store.close()


async def test_only_a_lost_nodes_stored_paused_sandbox_is_adopted(h: Harness) -> None:
    ours = await h.create()  # holds slot 0 here
    mine = await h.manager.store.get(ours)
    assert mine is not None
    other = SqlSandboxStore(h.manager.store.engine, "n2")
    nodes = NodeRegistry(h.manager.store.engine)
    await nodes.register("n2", "http://n2", NodeCapacity())
    vm = {"driver": "qemu", "pid": 4242, "workdir": "/elsewhere/x", "accel": "tcg",
          "extra": {"kit": "k1", "qmp": "/elsewhere/x.qmp"}}  # fmt: skip
    for slot, (sandbox_id, state, stored) in enumerate(
        (
            ("paused-stored", State.PAUSED, True),
            ("copying-stored", State.COPYING, True),
            ("paused-local", State.PAUSED, False),
            ("running", State.RUNNING, False),
        )
    ):
        record = dataclasses.replace(mine, sandbox_id=sandbox_id, state=state, stored=stored)
        record.vm, record.slot = vm, slot  # n2's slots: 0 is ours too
        await other.insert(record)

    with pytest.raises(Conflict, match="which is up"):
        await adopt(h.manager, nodes, "paused-stored")
    await nodes.fire("n2", NodeEvent.DRAIN)
    record = await adopt(h.manager, nodes, "paused-stored")  # drained off
    assert record.node == "node-1"
    await nodes.fire("n2", NodeEvent.LOSE)
    for sandbox_id in ("copying-stored", "paused-stored"):
        record = await adopt(h.manager, nodes, sandbox_id)
        assert (record.node, record.state) == ("node-1", State.PAUSED)
        assert record.slot != 0 and record.vm is not None
        assert (record.vm["pid"], record.vm["extra"]) == (0, {"kit": "k1"})
        assert await h.manager.store.get(sandbox_id) == record
        assert await adopt(h.manager, nodes, sandbox_id) == record  # already ours
    for sandbox_id in ("paused-local", "running"):
        with pytest.raises(NotFound, match="lost with node 'n2'"):
            await adopt(h.manager, nodes, sandbox_id)
    with pytest.raises(NotFound):
        await adopt(h.manager, nodes, "nope")
    assert {r.sandbox_id for r in await other.list()} == {"paused-local", "running"}


async def test_adoption_waits_for_the_sandboxs_lock(h: Harness) -> None:
    """It writes the record's state, so it takes the lock every state write takes."""
    nodes = NodeRegistry(h.manager.store.engine)
    async with h.manager.gate.lock("held"):
        adoption = asyncio.create_task(adopt(h.manager, nodes, "held"))
        await asyncio.sleep(0.05)
        assert not adoption.done()
    with pytest.raises(NotFound):
        await adoption
