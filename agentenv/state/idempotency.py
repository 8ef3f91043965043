"""Idempotency keys: an operation sent again with its key (a client's retry) gets the first
one's answer, also while the first still runs, and never runs twice.

Keys live in the state store, so they hold across restarts and every node and control
replica sharing the store sees them. The first request claims its key with a lease that
its run renews; a retry waits while the lease is live and takes the key over once it has
lapsed (its runner died: recovery cleans up what it left). An answer is kept 24 hours from
the first request; one a retry may change (a 5xx, 401, 403, 408, 429) is not kept: the key
is released and the retry runs the operation again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import Conflict, InvalidInput
from .schema import idempotency_keys as keys_table

log = logging.getLogger(__name__)

# E2B's shape for a key (the SDKs check it before sending).
KEY_SHAPE = re.compile(r"[a-z0-9-]{1,255}")
TTL_SECONDS = 24 * 3600.0
# A run renews its lease every third of it: two missed renewals still keep the key.
LEASE_SECONDS = 10.0
# How often a retry looks whether the run it waits for has answered.
POLL_SECONDS = 0.2
# Expired keys are deleted by a claim at most this often, per process.
PRUNE_EVERY = 60.0
# Answers a retry may change besides 5xx: credentials, a timeout, a rate limit.
_NOT_KEPT = frozenset({401, 403, 408, 429})


def check_key(key: str) -> str:
    """`key` if it has E2B's shape, else 400."""
    if not KEY_SHAPE.fullmatch(key):
        raise InvalidInput("Idempotency-Key: 1 to 255 characters of a-z, 0-9 and '-'")
    return key


class KeyReused(Conflict):
    """The key was used for another request (another body or route) within its 24 hours."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"Idempotency-Key '{key}' was used for another request (another body or route) "
            "within the last 24 hours: use a new key for a new request"
        )


@dataclass(frozen=True)
class Answer:
    """An operation's answer as its retries get it again."""

    status: int
    body: bytes

    @property
    def kept(self) -> bool:
        """The outcome for good: a success, or the client's own fault."""
        return self.status < 500 and self.status not in _NOT_KEPT


@dataclass(frozen=True)
class Held:
    """A key as another run holds it; `answer` once that run has one."""

    request: str
    answer: Answer | None


class KeyStore(Protocol):
    """Keys by scope; a run is named by its `owner` token."""

    lease: float

    async def claim(self, scope: str, key: str, request: str, owner: str) -> Held | None:
        """None when the key is now `owner`'s; else how another run holds it."""
        ...

    async def renew(self, scope: str, key: str, owner: str) -> bool: ...
    async def finish(self, scope: str, key: str, owner: str, answer: Answer) -> bool: ...
    async def release(self, scope: str, key: str, owner: str) -> None: ...


class SqlKeyStore:
    """The `idempotency_keys` table of a state store."""

    def __init__(
        self,
        engine: AsyncEngine,
        lease: float = LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.lease = lease
        self._clock = clock
        self._pruned = 0.0

    @staticmethod
    def _key(scope: str, key: str) -> sa.ColumnElement[bool]:
        return sa.and_(keys_table.c.scope == scope, keys_table.c.key == key)

    def _running(self, scope: str, key: str, owner: str) -> sa.ColumnElement[bool]:
        return sa.and_(
            self._key(scope, key), keys_table.c.owner == owner, keys_table.c.status.is_(None)
        )

    async def _rows(self, statement: sa.Insert | sa.Update | sa.Delete) -> int:
        async with self.engine.begin() as connection:
            return (await connection.execute(statement)).rowcount

    async def claim(self, scope: str, key: str, request: str, owner: str) -> Held | None:
        now = self._clock()
        if now - self._pruned > PRUNE_EVERY:
            await self.prune()
        # Inserted unless the key is there: no error to catch (PostgreSQL would log each).
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        insert: sa.Insert = (
            dialect.insert(keys_table)
            .values(
                scope=scope,
                key=key,
                request=request,
                owner=owner,
                lease_until=now + self.lease,
                created_at=now,
            )
            .on_conflict_do_nothing()
        )
        while True:
            if await self._rows(insert):
                return None
            if await self._rows(sa.delete(keys_table).where(self._key(scope, key), _expired(now))):
                continue  # its day is over: the key is free again
            async with self.engine.connect() as connection:
                query = sa.select(keys_table).where(self._key(scope, key))
                row = (await connection.execute(query)).first()
            if row is None:
                continue  # released meanwhile: claim it again
            if row.request != request:
                return Held(row.request, None)
            if row.status is not None:
                return Held(row.request, Answer(row.status, row.body))
            if row.lease_until < now and await self._take_over(scope, key, row, owner, now):
                return None
            return Held(row.request, None)

    async def _take_over(self, scope: str, key: str, row: Any, owner: str, now: float) -> bool:
        """The key from a run whose lease lapsed, unless another retry took it first."""
        taken = await self._rows(
            sa.update(keys_table)
            .where(self._running(scope, key, row.owner), keys_table.c.lease_until < now)
            .values(owner=owner, lease_until=now + self.lease)
        )
        if taken:
            log.warning("idempotency key %s: its run stopped answering, running it again", key)
        return bool(taken)

    async def renew(self, scope: str, key: str, owner: str) -> bool:
        """Extend the lease; False when the key is no longer `owner`'s."""
        statement = sa.update(keys_table).where(self._running(scope, key, owner))
        return bool(await self._rows(statement.values(lease_until=self._clock() + self.lease)))

    async def finish(self, scope: str, key: str, owner: str, answer: Answer) -> bool:
        """Keep `answer` for the key's retries; False when the key is no longer `owner`'s."""
        statement = sa.update(keys_table).where(self._running(scope, key, owner))
        return bool(await self._rows(statement.values(status=answer.status, body=answer.body)))

    async def release(self, scope: str, key: str, owner: str) -> None:
        """Give the key up without an answer: its next request runs the operation."""
        await self._rows(sa.delete(keys_table).where(self._running(scope, key, owner)))

    async def prune(self) -> int:
        """Delete the keys older than their 24 hours (but runs still holding theirs)."""
        now = self._clock()
        self._pruned = now
        return await self._rows(sa.delete(keys_table).where(_expired(now)))


def _expired(now: float) -> sa.ColumnElement[bool]:
    """Older than 24 hours, unless a run still holds it."""
    return sa.and_(
        keys_table.c.created_at < now - TTL_SECONDS,
        sa.or_(keys_table.c.status.is_not(None), keys_table.c.lease_until < now),
    )


async def run_once(
    keys: KeyStore,
    scope: str,
    key: str,
    request: str,
    operation: Callable[[], Awaitable[Answer]],
) -> tuple[Answer, bool]:
    """`operation`'s answer, run under `key`; or, when a run of this request holds the
    key, that run's answer once it has one (True: replayed). KeyReused (409) when the key
    was used for another request."""
    owner = secrets.token_hex(8)
    while (held := await keys.claim(scope, key, request, owner)) is not None:
        if held.request != request:
            raise KeyReused(key)
        if held.answer is not None:
            return held.answer, True
        await asyncio.sleep(POLL_SECONDS)
    renewing = asyncio.create_task(_renew(keys, scope, key, owner))
    answer: Answer | None = None
    try:
        answer = await operation()
    finally:
        renewing.cancel()
        # Shielded: a cancelled request still gives its key up (or a lease lapses).
        await asyncio.shield(_settle(keys, scope, key, owner, answer))
    return answer, False


async def _renew(keys: KeyStore, scope: str, key: str, owner: str) -> None:
    while True:
        await asyncio.sleep(keys.lease / 3)
        try:
            if not await keys.renew(scope, key, owner):
                log.warning("idempotency key %s: another run took it over", key)
                return
        except Exception:
            log.exception("idempotency key %s: renewing its lease failed", key)


async def _settle(keys: KeyStore, scope: str, key: str, owner: str, answer: Answer | None) -> None:
    """Keep a final answer for the key's retries; else give the key up."""
    try:
        if answer is not None and answer.kept:
            if not await keys.finish(scope, key, owner, answer):
                log.warning("idempotency key %s: another run took it over meanwhile", key)
        else:
            await keys.release(scope, key, owner)
    except Exception:
        # The answer still goes to the client; the key's lease lapses on its own.
        log.exception("idempotency key %s: recording its outcome failed", key)
