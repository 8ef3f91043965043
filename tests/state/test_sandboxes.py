from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from agentenv.state.lifecycle import State
from agentenv.state.sandboxes import SandboxRecord, SqlSandboxStore


def _record(sandbox_id: str, slot: int) -> SandboxRecord:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return SandboxRecord(
        sandbox_id=sandbox_id,
        template_id="base",
        state="creating",
        started_at=start,
        end_at=start + timedelta(seconds=300),
        vcpus=1,
        memory_mb=512,
        disk_mb=4096,
        slot=slot,
        metadata={"k": "v"},
        env_vars={"A": "1"},
        access_token="tok",
    )


async def test_round_trip_update_delete_and_persistence(state_url: str) -> None:
    store = await SqlSandboxStore.open(state_url, "n1")
    await store.insert(_record("a", 0))
    await store.insert(_record("b", 1))
    await store.update("a", state="running", vm={"pid": 1}, allow_internet=False)
    await store.close()

    store = await SqlSandboxStore.open(state_url, "n1")
    got = await store.get("a")
    assert got is not None
    assert got.state == "running"
    assert got.vm == {"pid": 1}
    assert got.allow_internet is False
    assert got.metadata == {"k": "v"}
    assert got.node == "n1"
    assert got.started_at == datetime(2026, 1, 1, tzinfo=UTC)
    await store.delete("a")
    assert [r.sandbox_id for r in await store.list()] == ["b"]
    assert await store.get("a") is None
    await store.close()


async def test_slots_are_unique_per_node_and_unknown_fields_refused(state_url: str) -> None:
    store = await SqlSandboxStore.open(state_url, "n1")
    await store.insert(_record("a", 0))
    with pytest.raises(IntegrityError):
        await store.insert(_record("b", 0))
    with pytest.raises(ValueError, match="unknown sandbox fields"):
        await store.update("a", colour="red")
    await store.close()


async def test_nodes_sharing_a_store_see_their_own_records(state_url: str) -> None:
    """Two nodes open one store at once (both migrate it); each lists, changes and
    deletes only its own records, while `list_all` sees everyone's."""
    one, two = await asyncio.gather(
        SqlSandboxStore.open(state_url, "n1"), SqlSandboxStore.open(state_url, "n2")
    )
    await asyncio.gather(*(one.insert(_record(f"a{i}", i)) for i in range(5)))
    await asyncio.gather(*(two.insert(_record(f"b{i}", i)) for i in range(5)))
    assert {r.sandbox_id for r in await one.list()} == {f"a{i}" for i in range(5)}
    assert await two.get("a0") is None
    await two.update("a0", state="running")
    await two.delete("a1")
    assert {r.sandbox_id for r in await one.list()} >= {"a0", "a1"}
    assert (await one.get("a0")).state == "creating"  # type: ignore[union-attr]
    assert len(await two.list_all()) == 10
    await one.close()
    await two.close()


async def test_a_store_an_older_server_made_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(
        "CREATE TABLE sandboxes (sandbox_id TEXT PRIMARY KEY, template_id TEXT NOT NULL,"
        " state TEXT NOT NULL, started_at TEXT NOT NULL, end_at TEXT NOT NULL,"
        " vcpus INTEGER NOT NULL, memory_mb INTEGER NOT NULL, disk_mb INTEGER NOT NULL,"
        " slot INTEGER NOT NULL UNIQUE, metadata TEXT NOT NULL, env_vars TEXT NOT NULL,"
        " auto_pause INTEGER NOT NULL, allow_internet INTEGER NOT NULL, access_token TEXT,"
        " alias TEXT, vm TEXT)"
    )
    db.execute(
        "INSERT INTO sandboxes VALUES ('old', 'base', 'paused', '2026-01-01T00:00:00+00:00',"
        " '2026-01-01T00:05:00+00:00', 1, 512, 4096, 0, '{}', '{}', 0, 1, NULL, NULL, NULL)"
    )
    db.commit()
    db.close()

    store = await SqlSandboxStore.open(f"sqlite:///{tmp_path / 'state.db'}", "n1")
    old = await store.get("old")
    assert old is not None
    assert (old.guest, old.auto_pause_memory, old.pause_mode) == ({}, True, None)
    assert old.agent_unresponsive_at_pause is False
    await store.update("old", pause_mode="filesystem", guest={"user": "user"})
    changed = await store.get("old")
    assert changed is not None
    assert (changed.pause_mode, changed.guest) == ("filesystem", {"user": "user"})
    await store.close()


async def test_pages_follow_the_listing_order_on_every_node(state_url: str) -> None:
    """Keyset pages in both directions equal the records sorted by (started_at, id), times
    with and without a fraction of a second included; states filter; nodes and counts."""
    stores = [await SqlSandboxStore.open(state_url, node) for node in ("n1", "n2")]
    start = datetime(2026, 1, 1, tzinfo=UTC)
    made = []
    for i in range(23):
        record = _record(f"s{i:02d}", i)
        # Ties on time, whole seconds and fractions of one.
        record.started_at = start + timedelta(seconds=i // 3, microseconds=(i % 2) * 500)
        record.state = "running" if i % 4 else "paused"
        await stores[i % 2].insert(record)
        made.append(record)
    store = stores[0]
    for descending in (False, True):
        expected = sorted(made, key=lambda r: (r.started_at, r.sandbox_id), reverse=descending)
        seen, after = [], None
        while page := await store.page(after, 5, descending=descending):
            seen += page
            after = (page[-1].started_at, page[-1].sandbox_id)
        assert [r.sandbox_id for r in seen] == [r.sandbox_id for r in expected]
    paused = await store.page(None, 100, states=[State.PAUSED])
    assert [r.sandbox_id for r in paused] == [r.sandbox_id for r in made if r.state == "paused"]
    assert {r.sandbox_id for r in await store.on_nodes(["n2"])} == {
        r.sandbox_id for i, r in enumerate(made) if i % 2
    }
    assert await store.count_by_state() == {"running": 17, "paused": 6}
    for each in stores:
        await each.close()


async def test_versions_say_what_a_listed_row_changes_with_and_many_reads_by_id(
    state_url: str,
) -> None:
    mine = await SqlSandboxStore.open(state_url, "n1")
    theirs = SqlSandboxStore(mine.engine, "n2")
    for n in range(3):
        await mine.insert(_record(f"m{n}", n))
    await theirs.insert(_record("t0", 0))
    await mine.update("m0", state=State.RUNNING)
    await mine.update("m1", state=State.KILLING)  # being killed: no longer listed

    versions = await mine.versions()
    assert sorted(versions) == ["m0", "m2"]
    assert versions["m0"][:2] == ("running", "n1")
    assert sorted(await mine.versions(everyone=True)) == ["m0", "m2", "t0"]
    before = versions["m0"]
    await mine.update("m0", end_at=datetime(2027, 1, 1, tzinfo=UTC))
    assert (await mine.versions())["m0"] != before

    found = await mine.many(["t0", "m2", "gone"])
    assert sorted(r.sandbox_id for r in found) == ["m2", "t0"]
    await mine.close()
