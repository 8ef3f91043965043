"""Sandbox state: the `SandboxStore` interface and its SQLite implementation."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ..runtime.lifecycle import State


@dataclass
class SandboxRecord:
    """One sandbox as persisted; `vm` is the driver's handle."""

    sandbox_id: str
    template_id: str
    state: State
    started_at: datetime
    end_at: datetime
    vcpus: int
    memory_mb: int
    disk_mb: int
    slot: int
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    allow_internet: bool = True
    access_token: str | None = None
    alias: str | None = None
    vm: dict[str, Any] | None = None
    # What a freshly started guest of this sandbox is given at /init (env, user, workdir):
    # a filesystem-only resume or rollback cold-starts the guest on its disk.
    guest: dict[str, Any] = field(default_factory=dict)
    # A timeout's auto-pause keeps memory (True) or the filesystem only (False).
    auto_pause_memory: bool = True
    # What the last pause kept: "full" (memory and disk) or "filesystem"; None: running.
    pause_mode: str | None = None
    # The object store's layers of its files as last uploaded (file name -> layer id), the
    # parents its next upload is diffed against; `stored`: they are its paused files now.
    layers: dict[str, str] = field(default_factory=dict)
    stored: bool = False


_JSON_FIELDS = ("metadata", "env_vars", "vm", "guest", "layers")
_TIME_FIELDS = ("started_at", "end_at")
_BOOL_FIELDS = ("auto_pause", "allow_internet", "auto_pause_memory", "stored")
_COLUMNS = [f.name for f in fields(SandboxRecord)]


class SandboxStore(Protocol):
    """What the runtime needs from state storage; PostgreSQL implements the same later."""

    async def insert(self, record: SandboxRecord) -> None: ...
    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...
    async def list(self) -> list[SandboxRecord]: ...
    async def update(self, sandbox_id: str, **changes: Any) -> None: ...
    async def delete(self, sandbox_id: str) -> None: ...
    async def close(self) -> None: ...


def _to_row(values: dict[str, Any]) -> dict[str, Any]:
    row = dict(values)
    for name in _JSON_FIELDS:
        if name in row:
            row[name] = None if row[name] is None else json.dumps(row[name])
    for name in _TIME_FIELDS:
        if name in row:
            row[name] = row[name].isoformat()
    for name in _BOOL_FIELDS:
        if name in row:
            row[name] = int(row[name])
    return row


def _from_row(row: sqlite3.Row) -> SandboxRecord:
    values = dict(row)
    for name in _JSON_FIELDS:
        values[name] = None if values[name] is None else json.loads(values[name])
    for name in _TIME_FIELDS:
        values[name] = datetime.fromisoformat(values[name])
    for name in _BOOL_FIELDS:
        values[name] = bool(values[name])
    values["state"] = State(values["state"])
    return SandboxRecord(**values)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    sandbox_id TEXT PRIMARY KEY,
    template_id TEXT NOT NULL,
    state TEXT NOT NULL,
    started_at TEXT NOT NULL,
    end_at TEXT NOT NULL,
    vcpus INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    disk_mb INTEGER NOT NULL,
    slot INTEGER NOT NULL UNIQUE,
    metadata TEXT NOT NULL,
    env_vars TEXT NOT NULL,
    auto_pause INTEGER NOT NULL,
    allow_internet INTEGER NOT NULL,
    access_token TEXT,
    alias TEXT,
    vm TEXT,
    guest TEXT NOT NULL DEFAULT '{}',
    auto_pause_memory INTEGER NOT NULL DEFAULT 1,
    pause_mode TEXT,
    layers TEXT NOT NULL DEFAULT '{}',
    stored INTEGER NOT NULL DEFAULT 0
);
"""

# Columns added after the first release, for stores an older server created. The cluster
# issue moves schemas to a migration library; until then a store only ever gains columns.
_ADDED_COLUMNS = {
    "guest": "TEXT NOT NULL DEFAULT '{}'",
    "auto_pause_memory": "INTEGER NOT NULL DEFAULT 1",
    "pause_mode": "TEXT",
    "layers": "TEXT NOT NULL DEFAULT '{}'",
    "stored": "INTEGER NOT NULL DEFAULT 0",
}


class SqliteSandboxStore:
    """SQLite in WAL mode; calls run in a worker thread so the event loop never blocks."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        present = {row["name"] for row in self._db.execute("PRAGMA table_info(sandboxes)")}
        for name, definition in _ADDED_COLUMNS.items():
            if name not in present:
                self._db.execute(f"ALTER TABLE sandboxes ADD COLUMN {name} {definition}")
        self._lock = threading.Lock()

    async def _call(self, sql: str, params: Any = ()) -> list[sqlite3.Row]:
        def run() -> list[sqlite3.Row]:
            with self._lock:
                return self._db.execute(sql, params).fetchall()

        return await asyncio.to_thread(run)

    async def insert(self, record: SandboxRecord) -> None:
        row = _to_row({name: getattr(record, name) for name in _COLUMNS})
        names = ", ".join(row)
        marks = ", ".join(f":{name}" for name in row)
        await self._call(f"INSERT INTO sandboxes ({names}) VALUES ({marks})", row)

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        rows = await self._call("SELECT * FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,))
        return _from_row(rows[0]) if rows else None

    async def list(self) -> list[SandboxRecord]:
        rows = await self._call("SELECT * FROM sandboxes ORDER BY started_at, sandbox_id")
        return [_from_row(row) for row in rows]

    async def update(self, sandbox_id: str, **changes: Any) -> None:
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown sandbox fields: {sorted(unknown)}")
        row = _to_row(changes)
        assignments = ", ".join(f"{name} = :{name}" for name in row)
        await self._call(
            f"UPDATE sandboxes SET {assignments} WHERE sandbox_id = :sandbox_id",
            {**row, "sandbox_id": sandbox_id},
        )

    async def delete(self, sandbox_id: str) -> None:
        await self._call("DELETE FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,))

    async def close(self) -> None:
        with self._lock:
            self._db.close()
