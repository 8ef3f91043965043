from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentenv.control.store import SandboxRecord, SqliteSandboxStore


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


async def test_round_trip_update_delete_and_persistence(tmp_path: Path) -> None:
    store = SqliteSandboxStore(tmp_path / "state.db")
    await store.insert(_record("a", 0))
    await store.insert(_record("b", 1))
    await store.update("a", state="running", vm={"pid": 1}, allow_internet=False)
    await store.close()

    store = SqliteSandboxStore(tmp_path / "state.db")
    got = await store.get("a")
    assert got is not None
    assert got.state == "running"
    assert got.vm == {"pid": 1}
    assert got.allow_internet is False
    assert got.metadata == {"k": "v"}
    assert got.started_at == datetime(2026, 1, 1, tzinfo=UTC)
    await store.delete("a")
    assert [r.sandbox_id for r in await store.list()] == ["b"]
    assert await store.get("a") is None
    await store.close()


async def test_slots_are_unique_and_unknown_fields_refused(tmp_path: Path) -> None:
    store = SqliteSandboxStore(tmp_path / "state.db")
    await store.insert(_record("a", 0))
    with pytest.raises(Exception, match="UNIQUE"):
        await store.insert(_record("b", 0))
    with pytest.raises(ValueError, match="unknown sandbox fields"):
        await store.update("a", colour="red")
    await store.close()


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

    store = SqliteSandboxStore(tmp_path / "state.db")
    old = await store.get("old")
    assert old is not None
    assert (old.guest, old.auto_pause_memory, old.pause_mode) == ({}, True, None)
    await store.update("old", pause_mode="filesystem", guest={"user": "user"})
    changed = await store.get("old")
    assert changed is not None
    assert (changed.pause_mode, changed.guest) == ("filesystem", {"user": "user"})
    await store.close()
