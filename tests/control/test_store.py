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
