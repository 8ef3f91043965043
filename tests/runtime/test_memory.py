"""The node's memory keeper on fakes: samples running sandboxes, relieves pressure by
asking idle guests to reclaim and then pausing the longest idle, and sets balloons only
on running sandboxes within bounds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentenv.errors import Conflict, InvalidInput
from agentenv.runtime.node import memorykeeper as memory_module
from agentenv.runtime.node.memorykeeper import Footprint, MemoryKeeper

from .fakes import FakeAgent, Harness, make_harness


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    # Fake VMs have no /proc entry of their own.
    monkeypatch.setattr(memory_module, "footprint", lambda pid: Footprint(100 << 20, 60 << 20))
    yield harness
    await harness.manager.store.close()


async def _sandboxes_idle_for(
    h: Harness, monkeypatch: pytest.MonkeyPatch, idle: list[float]
) -> dict[str, FakeAgent]:
    """One sandbox per entry, each with its own agent reporting that many idle seconds."""
    agents = {}
    for seconds in idle:
        sandbox_id = await h.create()
        agents[sandbox_id] = FakeAgent(idle_seconds=seconds)
    monkeypatch.setattr(h.manager.machines, "agent", lambda record: agents[record.sandbox_id])
    return agents


class Host:
    """Available memory that a pause raises, as pausing a VM would."""

    def __init__(self, available_mb: int) -> None:
        self.available_mb = available_mb
        self.paused: list[str] = []

    def available(self) -> int:
        return self.available_mb

    async def pause(self, sandbox_id: str) -> None:
        self.paused.append(sandbox_id)
        self.available_mb += 600


async def test_samples_report_host_and_idle_figures(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = await _sandboxes_idle_for(h, monkeypatch, [5.0, 40.0])
    keeper = MemoryKeeper(h.manager, Host(10**6).pause)
    await keeper.sample()
    assert set(keeper.latest) == set(agents)
    assert {s.idle_seconds for s in keeper.latest.values()} == {5.0, 40.0}
    assert {s.guest_used for s in keeper.latest.values()} == {40 << 20}
    assert keeper.held_mb() == 200


async def test_pressure_reclaims_from_idle_guests_then_pauses_the_longest_idle(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = await _sandboxes_idle_for(h, monkeypatch, [10.0, 50.0, 0.0])
    reserve = h.manager.cfg.sandbox.min_free_memory_mb
    host = Host(reserve - 100)
    keeper = MemoryKeeper(h.manager, host.pause, settle=0, available=host.available)
    await keeper.sample()
    await keeper.relieve()
    reclaimed = {sid for sid, agent in agents.items() if agent.reclaims}
    busy = next(sid for sid, agent in agents.items() if agent.idle_seconds == 0)
    longest = max(agents, key=lambda sid: agents[sid].idle_seconds)
    assert reclaimed == set(agents) - {busy}
    # One pause lifted the host above its reserve: nobody else was touched.
    assert host.paused == [longest]


async def test_without_pressure_nothing_happens(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = await _sandboxes_idle_for(h, monkeypatch, [100.0])
    host = Host(10**6)
    keeper = MemoryKeeper(h.manager, host.pause, settle=0, available=host.available)
    await keeper.sample()
    await keeper.relieve()
    assert host.paused == [] and not any(a.reclaims for a in agents.values())


async def test_pausing_under_pressure_can_be_turned_off(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = await _sandboxes_idle_for(h, monkeypatch, [100.0])
    h.manager.cfg.sandbox.pause_under_pressure = False
    host = Host(0)
    keeper = MemoryKeeper(h.manager, host.pause, settle=0, available=host.available)
    await keeper.sample()
    await keeper.relieve()
    assert host.paused == [] and all(a.reclaims == 1 for a in agents.values())


async def test_a_balloon_is_set_within_bounds_on_running_sandboxes_only(h: Harness) -> None:
    keeper = MemoryKeeper(h.manager, Host(10**6).pause)
    sandbox_id = await h.create()
    for bad in (0, 64, h.manager.cfg.sandbox.memory_mb + 1):
        with pytest.raises(InvalidInput):
            await keeper.set_balloon(sandbox_id, bad)
    await keeper.set_balloon(sandbox_id, 200)
    assert (await keeper.balloon(sandbox_id)).actual_mb == 200
    await h.pauses.pause(sandbox_id)
    with pytest.raises(Conflict):
        await keeper.set_balloon(sandbox_id, 200)
    with pytest.raises(Conflict):
        await keeper.balloon(sandbox_id)


async def test_a_sandbox_pauses_once_idle_as_long_as_it_asked(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = await _sandboxes_idle_for(h, monkeypatch, [100.0, 100.0, 10.0])
    patient, _no_policy, eager = list(agents)
    await h.manager.store.update(patient, pause_after_idle=60)
    await h.manager.store.update(eager, pause_after_idle=60)
    host = Host(10**6)
    keeper = MemoryKeeper(h.manager, host.pause, settle=0, available=host.available)
    await keeper.sample()
    await keeper.pause_idle()
    # The second has no policy; `eager` has not been idle long enough yet.
    assert host.paused == [patient]
