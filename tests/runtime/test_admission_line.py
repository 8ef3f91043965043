"""Past capacity, creates wait in line for room, first come first, then get 429."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentenv.errors import AtCapacity
from agentenv.runtime.memory import admission
from agentenv.runtime.memory.admission import Capacity, Demand

from .fakes import Harness, make_harness


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    monkeypatch.setattr(admission, "available_memory_mb", lambda: 1 << 30)
    monkeypatch.setattr(admission, "available_disk_mb", lambda _path: 1 << 30)
    harness = await make_harness(tmp_path, monkeypatch)
    # Room for one 256 MiB sandbox (the harness's size).
    harness.manager.intake.capacity = Capacity(memory_mb=400, disk_mb=1 << 30, max_vcpus=2)
    harness.manager.cfg.sandbox.admission_wait = 3.0
    yield harness
    await harness.manager.store.close()


async def test_a_create_waits_for_room_and_gets_it(h: Harness) -> None:
    first = await h.create()
    waiting = asyncio.create_task(h.create())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await h.manager.kill(first)
    second = await asyncio.wait_for(waiting, 2)
    assert await h.state(second) == "running"


async def test_past_the_wait_the_answer_is_429_naming_the_resource(h: Harness) -> None:
    await h.create()
    h.manager.cfg.sandbox.admission_wait = 0.3
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AtCapacity, match=r"not enough host memory.*waited 0.3 s") as refused:
        await h.create()
    assert refused.value.status == 429 and refused.value.retry_after == 1
    assert 0.2 <= loop.time() - started < 1.0
    assert len(await h.manager.store.list()) == 1


async def test_first_come_first_admitted(h: Harness) -> None:
    """A small demand behind a large one waits: it does not take the room freed for it."""
    first = await h.create()
    intake = h.manager.intake
    order: list[str] = []

    async def admit(name: str, memory_mb: int) -> None:
        async with intake.admitted(Demand(memory_mb, 0, 1)):
            order.append(name)

    large = asyncio.create_task(admit("large", 350))
    await asyncio.sleep(0.05)
    small = asyncio.create_task(admit("small", 100))  # would fit now, beside `first`
    await asyncio.sleep(0.3)
    assert order == []
    await h.manager.kill(first)
    await asyncio.wait_for(asyncio.gather(large, small), 2)
    assert order == ["large", "small"]


async def test_those_behind_the_head_are_told_why(h: Harness) -> None:
    await h.create()
    head = asyncio.create_task(h.create())  # waits 3 s at the head of the line
    await asyncio.sleep(0.2)
    h.manager.cfg.sandbox.admission_wait = 0.3
    with pytest.raises(AtCapacity) as refused:
        await h.create()
    assert "not enough host memory" in str(refused.value)
    assert "1 earlier requests wait for room; waited 0.3 s" in str(refused.value)
    with pytest.raises(AtCapacity, match="waited 3 s for room"):
        await head


async def test_a_line_that_moves_is_no_full_host(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests admitted one after another past the wait, each slow to record (a loaded
    node), all get in: the wait bounds waiting for room, not for a turn."""
    h.manager.intake.capacity = Capacity(memory_mb=1 << 20, disk_mb=1 << 30, max_vcpus=2)
    h.manager.cfg.sandbox.admission_wait = 0.3
    store = h.manager.store
    insert = store.insert

    async def slow_insert(record):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.1)
        await insert(record)

    monkeypatch.setattr(store, "insert", slow_insert)
    created = await asyncio.wait_for(asyncio.gather(*(h.create() for _ in range(8))), 10)
    assert len(set(created)) == 8  # 0.8 s of turns, past the 0.3 s wait
