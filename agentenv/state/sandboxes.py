"""Sandbox state: the `SandboxStore` interface and its implementation on SQLAlchemy, for
SQLite (one node) and PostgreSQL (many nodes and control replicas)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import fcntl
import json
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..observe.metrics import STATE_STATEMENTS
from .lifecycle import AT_REST, EXPIRES, State
from .lost import lost_row
from .schema import lost_sandboxes, sandboxes

# Pause modes, as E2B names them (`SandboxRecord.pause_mode`): memory and disk, or the disk.
FULL = "full"
FILESYSTEM = "filesystem"


@dataclass
class SandboxOptions:
    """What a sandbox's creator chose, beyond its template and size; a fork inherits it."""

    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    auto_pause_memory: bool = True
    allow_internet: bool = True
    # With an envd access token (E2B's `secure`).
    secure: bool = False
    pause_after_idle: int = 0
    auto_resume: bool = False
    # E2B's `network` option, checked (`net/rules.py`).
    network: dict[str, Any] = field(default_factory=dict)
    # Volumes to mount, checked: [{name, volumeID, path}] (`runtime/machine/mounts.py`).
    volume_mounts: list[dict[str, str]] = field(default_factory=list)
    # Workload identity tokens it may have minted: {"tokens": {name: {audience, tokenType}}}.
    iam: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, record: SandboxRecord) -> SandboxOptions:
        kept = {name: copy.copy(getattr(record, name)) for name in _OPTION_FIELDS}
        return cls(secure=record.access_token is not None, **kept)

    def record_fields(self) -> dict[str, Any]:
        """The record's fields these options set as they are (`secure` makes a token)."""
        return {name: copy.copy(getattr(self, name)) for name in _OPTION_FIELDS}


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
    # The node that runs it or holds its paused files (set by that node's store).
    node: str = ""
    # Paused once its guest has been idle this long, in seconds (`runtime/node/memorykeeper.py`);
    # 0: never.
    pause_after_idle: int = 0
    # Paused (by its timeout), it resumes when traffic for it reaches the proxy.
    auto_resume: bool = False
    # E2B's `network` option as given (`allowOut`, `denyOut`, `allowPublicTraffic`,
    # `maskRequestHost`); `net/rules.py` reads its egress rules.
    network: dict[str, Any] = field(default_factory=dict)
    # With `allowPublicTraffic: false`: the token requests to its ports must carry.
    traffic_token: str | None = None
    # Volumes mounted into it: [{"name", "volumeID", "path"}] (`runtime/machine/mounts.py`).
    volume_mounts: list[dict[str, str]] = field(default_factory=list)
    # Its workload identity tokens (`credentials/identity.py`): definitions, nothing secret.
    iam: dict[str, Any] = field(default_factory=dict)
    # Its guest agent did not answer when its last pause saved its memory (E2B's
    # `envdUnresponsiveAtPause`): restoring that memory would bring the silent agent back.
    agent_unresponsive_at_pause: bool = False

    @property
    def saved_unresponsive_agent(self) -> bool:
        """Paused with its memory, which holds an agent that did not answer."""
        return self.agent_unresponsive_at_pause and self.pause_mode == FULL


# Options a record keeps under the same name.
_OPTION_FIELDS = tuple(f.name for f in fields(SandboxOptions) if f.name != "secure")
_JSON_FIELDS = ("metadata", "env_vars", "vm", "guest", "layers", "network", "volume_mounts", "iam")
_TIME_FIELDS = ("started_at", "end_at")
_COLUMNS = [f.name for f in fields(SandboxRecord)]
_MIGRATIONS = Path(__file__).with_name("migrations")
_DRIVERS = {"sqlite:": "sqlite+aiosqlite:", "postgresql:": "postgresql+asyncpg:"}
# Any number: every process migrating one PostgreSQL store takes this lock first.
_MIGRATION_LOCK = 0x61656E76


@dataclass(frozen=True)
class Footprint:
    """What a sandbox holds on its node, without the rest of its record: admission, slots
    and heartbeats read these for every sandbox, as often as a create comes."""

    sandbox_id: str
    state: State
    memory_mb: int
    disk_mb: int
    vcpus: int
    slot: int


@dataclass(frozen=True)
class Lease:
    """A sandbox's time and VM, which the sweeper reads every second for each one."""

    sandbox_id: str
    state: State
    end_at: datetime
    vm: dict[str, Any] | None


class SandboxStore(Protocol):
    """What a node's runtime needs from state storage: its own records (`node`'s)."""

    node: str

    async def insert(self, record: SandboxRecord) -> None: ...
    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...
    async def list(self) -> list[SandboxRecord]: ...
    async def footprints(self) -> builtins.list[Footprint]: ...
    async def leases(self) -> builtins.list[Lease]: ...
    async def unstored(self) -> builtins.list[SandboxRecord]: ...
    async def list_all(self) -> builtins.list[SandboxRecord]: ...
    async def get_any(self, sandbox_id: str) -> SandboxRecord | None: ...
    async def owners(self, sandbox_ids: builtins.list[str]) -> dict[str, str]: ...
    async def versions(self, everyone: bool = False) -> dict[str, tuple[str, str, str]]: ...
    async def many(self, sandbox_ids: Collection[str]) -> builtins.list[SandboxRecord]: ...
    async def take_over(
        self, record: SandboxRecord, slot: int, state: State, vm: dict[str, Any] | None
    ) -> bool: ...
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
    return row


def _from_row(row: sa.Row[Any]) -> SandboxRecord:
    values = dict(row._mapping)
    for name in _JSON_FIELDS:
        values[name] = None if values[name] is None else json.loads(values[name])
    for name in _TIME_FIELDS:
        values[name] = datetime.fromisoformat(values[name])
    values["state"] = State(values["state"])
    return SandboxRecord(**values)


def engine_url(url: str) -> str:
    """SQLAlchemy's asyncio URL for a `state.url` (`sqlite:///PATH`, `postgresql://…`)."""
    for scheme, driver in _DRIVERS.items():
        if url.startswith(scheme):
            return driver + url.removeprefix(scheme)
    raise ValueError(f"state.url {url!r}: use sqlite:///PATH or postgresql://…")


def _migrate(connection: sa.Connection) -> None:
    if connection.dialect.name == "postgresql":
        # Replicas starting at once: one migrates, the others then find nothing to do.
        connection.execute(sa.text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, "head")


# Ids in one `IN (...)` read: far below SQLite's and PostgreSQL's bound on parameters.
_IDS_PER_READ = 500
# Connections a PostgreSQL engine keeps open between uses, at most.
KEPT_CONNECTIONS = 5
# SQLSTATE classes of a store that cannot take the request now (connection exceptions,
# insufficient resources such as too many clients, operator intervention).
_UNAVAILABLE_STATES = ("08", "53", "57P")


def store_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the state store cannot serve now (busy, refusing connections,
    restarting) rather than that a statement was wrong."""
    if isinstance(exc, (sa.exc.TimeoutError, sa.exc.OperationalError, sa.exc.InterfaceError)):
        return True
    if isinstance(exc, sa.exc.DBAPIError):
        sqlstate = str(getattr(exc.orig, "sqlstate", "") or "")
        return sqlstate.startswith(_UNAVAILABLE_STATES)
    return False


async def open_engine(url: str, max_connections: int = 15) -> AsyncEngine:
    """An engine on the store at `url`, its schema migrated to this version's; on
    PostgreSQL it opens at most `max_connections`."""
    pool: dict[str, int] = {}
    if url.startswith("postgresql:"):
        kept = min(KEPT_CONNECTIONS, max_connections)
        pool = {"pool_size": kept, "max_overflow": max(0, max_connections - kept)}
    engine = create_async_engine(engine_url(url), **pool)
    sa.event.listen(engine.sync_engine, "before_cursor_execute", _counted)
    if engine.dialect.name == "sqlite":
        if engine.url.database:
            Path(engine.url.database).parent.mkdir(parents=True, exist_ok=True)
        sa.event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    try:
        async with _sqlite_file_lock(engine):
            async with engine.begin() as connection:
                await connection.run_sync(_migrate)
    except BaseException:
        await engine.dispose()
        raise
    return engine


@contextlib.asynccontextmanager
async def _sqlite_file_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """For a SQLite file, processes opening it at once migrate it one after the other
    (PostgreSQL has its advisory lock in `_migrate`)."""
    if engine.dialect.name != "sqlite" or not engine.url.database:
        yield
        return
    with open(engine.url.database + ".migrating", "a") as held:
        await asyncio.to_thread(fcntl.flock, held, fcntl.LOCK_EX)
        yield


def _counted(*_: Any) -> None:
    STATE_STATEMENTS.inc()


def _sqlite_pragmas(dbapi_connection: Any, _: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


class SqlSandboxStore:
    """One node's records in a shared store; `list_all` sees every node's."""

    def __init__(self, engine: AsyncEngine, node: str) -> None:
        self.engine = engine
        self.node = node

    @classmethod
    async def open(cls, url: str, node: str, max_connections: int = 15) -> SqlSandboxStore:
        """Open (and migrate) the store; records no node owns yet (a store from before
        nodes had names) become `node`'s."""
        engine = await open_engine(url, max_connections)
        store = cls(engine, node)
        async with engine.begin() as connection:
            await connection.execute(
                sa.update(sandboxes).where(sandboxes.c.node == "").values(node=node)
            )
        return store

    def _mine(self, sandbox_id: str) -> sa.ColumnElement[bool]:
        return sa.and_(sandboxes.c.sandbox_id == sandbox_id, sandboxes.c.node == self.node)

    async def _rows(self, query: sa.Select[Any]) -> list[SandboxRecord]:
        async with self.engine.connect() as connection:
            return [_from_row(row) for row in await connection.execute(query)]

    @contextlib.asynccontextmanager
    async def _transaction(
        self, connection: AsyncConnection | None
    ) -> AsyncIterator[AsyncConnection]:
        """`connection`, inside its caller's transaction; else a transaction of its own."""
        if connection is not None:
            yield connection
            return
        async with self.engine.begin() as begun:
            yield begun

    async def _write(self, statement: sa.Executable) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(statement)

    async def insert(self, record: SandboxRecord) -> None:
        record.node = self.node
        row = _to_row({name: getattr(record, name) for name in _COLUMNS})
        await self._write(sa.insert(sandboxes).values(**row))

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        rows = await self._rows(sa.select(sandboxes).where(self._mine(sandbox_id)))
        return rows[0] if rows else None

    async def list(self) -> list[SandboxRecord]:
        order = (sandboxes.c.started_at, sandboxes.c.sandbox_id)
        return await self._rows(
            sa.select(sandboxes).where(sandboxes.c.node == self.node).order_by(*order)
        )

    async def footprints(self) -> builtins.list[Footprint]:
        """This node's sandboxes' footprints (`Footprint`)."""
        columns = [getattr(sandboxes.c, f.name) for f in fields(Footprint)]
        query = sa.select(*columns).where(sandboxes.c.node == self.node)
        async with self.engine.connect() as connection:
            return [
                Footprint(row[0], State(row[1]), *row[2:])
                for row in await connection.execute(query)
            ]

    async def leases(self) -> builtins.list[Lease]:
        """This node's sandboxes' leases (`Lease`) in states that expire."""
        columns = (sandboxes.c.sandbox_id, sandboxes.c.state, sandboxes.c.end_at, sandboxes.c.vm)
        query = sa.select(*columns).where(
            sandboxes.c.node == self.node, sandboxes.c.state.in_([s.value for s in EXPIRES])
        )
        async with self.engine.connect() as connection:
            return [
                Lease(
                    i, State(s), datetime.fromisoformat(end), None if vm is None else json.loads(vm)
                )
                for i, s, end, vm in await connection.execute(query)
            ]

    async def unstored(self) -> builtins.list[SandboxRecord]:
        """This node's paused sandboxes whose state is not in the object store yet."""
        return await self._rows(
            sa.select(sandboxes).where(
                sandboxes.c.node == self.node,
                sandboxes.c.state.in_([s.value for s in AT_REST]),
                sandboxes.c.stored == sa.false(),
            )
        )

    async def list_all(self) -> builtins.list[SandboxRecord]:
        order = (sandboxes.c.started_at, sandboxes.c.sandbox_id)
        return await self._rows(sa.select(sandboxes).order_by(*order))

    async def page(
        self,
        after: tuple[datetime, str] | None,
        limit: int,
        *,
        descending: bool = False,
        states: Collection[State] = (),
    ) -> builtins.list[SandboxRecord]:
        """Every node's records (in `states`, if any) after the `(started_at, sandbox_id)`
        cursor in listing order, at most `limit`: one page read by the index alone. Times
        are compared as stored, ISO text in UTC, whose order is theirs."""
        key = sa.tuple_(sandboxes.c.started_at, sandboxes.c.sandbox_id)
        query = sa.select(sandboxes)
        if after is not None:
            cursor = sa.tuple_(
                sa.literal(after[0].astimezone(UTC).isoformat()), sa.literal(after[1])
            )
            query = query.where(key < cursor if descending else key > cursor)
        if states:
            query = query.where(sandboxes.c.state.in_([s.value for s in states]))
        columns = (sandboxes.c.started_at, sandboxes.c.sandbox_id)
        order = [c.desc() for c in columns] if descending else list(columns)
        return await self._rows(query.order_by(*order).limit(limit))

    async def versions(self, everyone: bool = False) -> dict[str, tuple[str, str, str]]:
        """Each visible record's (state, node, end) by id, this node's or `everyone`'s: what
        a listed row changes with, read without decoding whole records."""
        visible = [s.value for s in State if s.visible]
        columns = (sandboxes.c.sandbox_id, sandboxes.c.state, sandboxes.c.node, sandboxes.c.end_at)
        query = sa.select(*columns).where(sandboxes.c.state.in_(visible))
        if not everyone:
            query = query.where(sandboxes.c.node == self.node)
        async with self.engine.connect() as connection:
            return {i: (s, n, e) for i, s, n, e in await connection.execute(query)}

    async def many(self, sandbox_ids: Collection[str]) -> builtins.list[SandboxRecord]:
        """The records of `sandbox_ids` that exist, whichever node's, read in chunks."""
        ids = list(sandbox_ids)
        found: builtins.list[SandboxRecord] = []
        for at in range(0, len(ids), _IDS_PER_READ):
            chunk = ids[at : at + _IDS_PER_READ]
            found += await self._rows(sa.select(sandboxes).where(sandboxes.c.sandbox_id.in_(chunk)))
        return found

    async def on_nodes(
        self, names: Collection[str], connection: AsyncConnection | None = None
    ) -> builtins.list[SandboxRecord]:
        """The records of the nodes `names` (read in `connection`'s transaction, if given)."""
        query = sa.select(sandboxes).where(sandboxes.c.node.in_(list(names)))
        if connection is None:
            return await self._rows(query)
        return [_from_row(row) for row in await connection.execute(query)]

    async def count_by_state(self) -> dict[State, int]:
        """How many records each state has, every node's."""
        query = sa.select(sandboxes.c.state, sa.func.count()).group_by(sandboxes.c.state)
        async with self.engine.connect() as connection:
            return {State(state): count for state, count in await connection.execute(query)}

    async def get_any(self, sandbox_id: str) -> SandboxRecord | None:
        """The record whichever node it belongs to."""
        rows = await self._rows(sa.select(sandboxes).where(sandboxes.c.sandbox_id == sandbox_id))
        return rows[0] if rows else None

    async def owners(self, sandbox_ids: builtins.list[str]) -> dict[str, str]:
        """The node of each of `sandbox_ids` that has a record."""
        query = sa.select(sandboxes.c.sandbox_id, sandboxes.c.node).where(
            sandboxes.c.sandbox_id.in_(sandbox_ids)
        )
        async with self.engine.connect() as connection:
            return {row.sandbox_id: row.node for row in await connection.execute(query)}

    async def take_over(
        self, record: SandboxRecord, slot: int, state: State, vm: dict[str, Any] | None
    ) -> bool:
        """Make another node's record this node's, with a slot and a VM handle of this
        node's, unless it changed meanwhile: only one node can take it."""
        taken = await self._update_rows(
            sa.update(sandboxes)
            .where(
                sandboxes.c.sandbox_id == record.sandbox_id,
                sandboxes.c.node == record.node,
                sandboxes.c.state == record.state.value,
            )
            .values(node=self.node, slot=slot, state=state.value, vm=_to_row({"vm": vm})["vm"])
        )
        if taken:
            record.node, record.slot, record.state, record.vm = self.node, slot, state, vm
        return bool(taken)

    async def forget(
        self, records: builtins.list[SandboxRecord], connection: AsyncConnection | None = None
    ) -> builtins.list[str]:
        """Delete other nodes' records, each unless it changed meanwhile, and record their
        loss, in one transaction, `connection`'s if given (the control plane drops the
        sandboxes a lost node took with it); the ids forgotten."""
        forgotten = []
        async with self._transaction(connection) as connection:
            for record in records:
                mine = sa.and_(
                    sandboxes.c.sandbox_id == record.sandbox_id,
                    sandboxes.c.node == record.node,
                    sandboxes.c.state == record.state.value,
                )
                if not (await connection.execute(sa.delete(sandboxes).where(mine))).rowcount:
                    continue
                row = lost_row(
                    record.sandbox_id, record.node, record.template_id, record.state,
                    record.metadata,
                )  # fmt: skip
                await connection.execute(sa.insert(lost_sandboxes).values(**row))
                forgotten.append(record.sandbox_id)
        return forgotten

    async def _update_rows(self, statement: sa.Update | sa.Delete) -> int:
        async with self.engine.begin() as connection:
            return (await connection.execute(statement)).rowcount

    async def update(self, sandbox_id: str, **changes: Any) -> None:
        unknown = set(changes) - set(_COLUMNS)
        if unknown:
            raise ValueError(f"unknown sandbox fields: {sorted(unknown)}")
        await self._write(
            sa.update(sandboxes).where(self._mine(sandbox_id)).values(**_to_row(changes))
        )

    async def delete(self, sandbox_id: str) -> None:
        await self._write(sa.delete(sandboxes).where(self._mine(sandbox_id)))

    async def close(self) -> None:
        await self.engine.dispose()
