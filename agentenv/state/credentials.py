"""Hosted credentials in the state store: secrets and the identity signing keys, each
behind an interface with its implementation on SQLAlchemy (SQLite, PostgreSQL).

What is secret arrives here sealed (`key_id` names the server key, `sealed` is opaque):
sealing is `credentials/`'s, so nothing on this floor ever holds a value in clear.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import Conflict
from .schema import secrets, signing_keys


@dataclass(frozen=True)
class Sealed:
    """A value sealed with the server key `key_id`."""

    key_id: str
    sealed: bytes


@dataclass
class SecretRecord:
    secret_id: str
    name: str
    version: int
    metadata: dict[str, str]
    created_at: datetime
    updated_at: datetime
    value: Sealed


@dataclass(frozen=True)
class SigningKeyRecord:
    kid: str
    generation: int
    algorithm: str
    public_jwk: dict[str, str]
    created_at: float
    active_at: float
    private_key: Sealed


class SecretStore(Protocol):
    """The secrets every node of a store shares."""

    async def insert(self, record: SecretRecord) -> None: ...
    async def find(self, key: str) -> SecretRecord | None: ...
    async def page(
        self, limit: int | None, after: tuple[datetime, str] | None
    ) -> builtins.list[SecretRecord]: ...
    async def replace_value(
        self, secret_id: str, value: Sealed, metadata: dict[str, str] | None, when: datetime
    ) -> SecretRecord | None: ...
    async def delete(self, secret_id: str) -> bool: ...
    async def list(self) -> builtins.list[SecretRecord]: ...
    async def reseal(self, secret_id: str, old: Sealed, new: Sealed) -> bool: ...


class SigningKeyStore(Protocol):
    """The signing keys every node of a store shares."""

    async def list(self) -> list[SigningKeyRecord]: ...
    async def add(self, record: SigningKeyRecord) -> bool: ...
    async def remove(self, kids: builtins.list[str]) -> None: ...
    async def reseal(self, kid: str, old: Sealed, new: Sealed) -> bool: ...


def _time(when: datetime) -> str:
    """A fixed-width ISO 8601 time in UTC: text order is time order."""
    return when.astimezone(UTC).isoformat(timespec="microseconds")


def _secret(row: sa.Row[Any]) -> SecretRecord:
    return SecretRecord(
        secret_id=row.secret_id,
        name=row.name,
        version=row.version,
        metadata=json.loads(row.metadata),
        created_at=datetime.fromisoformat(row.created_at),
        updated_at=datetime.fromisoformat(row.updated_at),
        value=Sealed(row.key_id, bytes(row.sealed)),
    )


def _signing_key(row: sa.Row[Any]) -> SigningKeyRecord:
    return SigningKeyRecord(
        kid=row.kid,
        generation=row.generation,
        algorithm=row.algorithm,
        public_jwk=json.loads(row.public_jwk),
        created_at=row.created_at,
        active_at=row.active_at,
        private_key=Sealed(row.key_id, bytes(row.sealed)),
    )


class SqlSecretStore:
    """The `secrets` table."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def insert(self, record: SecretRecord) -> None:
        """Conflict when its name is taken."""
        row = {
            **{k: v for k, v in asdict(record).items() if k != "value"},
            "metadata": json.dumps(record.metadata),
            "created_at": _time(record.created_at),
            "updated_at": _time(record.updated_at),
            **asdict(record.value),
        }
        try:
            async with self.engine.begin() as connection:
                await connection.execute(sa.insert(secrets).values(**row))
        except IntegrityError:
            raise Conflict(f"a secret named '{record.name}' already exists") from None

    async def find(self, key: str) -> SecretRecord | None:
        """By id or by name (names never look like ids)."""
        query = sa.select(secrets).where(sa.or_(secrets.c.secret_id == key, secrets.c.name == key))
        async with self.engine.connect() as connection:
            row = (await connection.execute(query)).first()
        return None if row is None else _secret(row)

    async def page(
        self, limit: int | None, after: tuple[datetime, str] | None
    ) -> builtins.list[SecretRecord]:
        """Up to `limit` (None: all), oldest first, after the cursor `(created_at, secret_id)`."""
        order = (secrets.c.created_at, secrets.c.secret_id)
        query = sa.select(secrets).order_by(*order).limit(limit)
        if after is not None:
            query = query.where(sa.tuple_(*order) > sa.tuple_(_time(after[0]), after[1]))
        async with self.engine.connect() as connection:
            return [_secret(row) for row in await connection.execute(query)]

    async def list(self) -> builtins.list[SecretRecord]:
        return await self.page(None, None)

    async def replace_value(
        self, secret_id: str, value: Sealed, metadata: dict[str, str] | None, when: datetime
    ) -> SecretRecord | None:
        """The next version holds `value` (and `metadata`, when given); None: no such secret."""
        changes: dict[str, Any] = {
            "version": secrets.c.version + 1,
            "updated_at": _time(when),
            **asdict(value),
        }
        if metadata is not None:
            changes["metadata"] = json.dumps(metadata)
        mine = secrets.c.secret_id == secret_id
        # One transaction: the version read back is the one this update wrote.
        async with self.engine.begin() as connection:
            await connection.execute(sa.update(secrets).where(mine).values(**changes))
            row = (await connection.execute(sa.select(secrets).where(mine))).first()
        return None if row is None else _secret(row)

    async def delete(self, secret_id: str) -> bool:
        async with self.engine.begin() as connection:
            result = await connection.execute(
                sa.delete(secrets).where(secrets.c.secret_id == secret_id)
            )
        return bool(result.rowcount)

    async def reseal(self, secret_id: str, old: Sealed, new: Sealed) -> bool:
        """Put `new` in place of `old`, unless the value changed meanwhile."""
        return await _reseal(self.engine, secrets, secrets.c.secret_id == secret_id, old, new)


class SqlSigningKeyStore:
    """The `signing_keys` table."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def list(self) -> list[SigningKeyRecord]:
        """Every key, oldest generation first."""
        query = sa.select(signing_keys).order_by(signing_keys.c.generation)
        async with self.engine.connect() as connection:
            return [_signing_key(row) for row in await connection.execute(query)]

    async def add(self, record: SigningKeyRecord) -> bool:
        """False when another process took its generation first."""
        row = {
            **{k: v for k, v in asdict(record).items() if k != "private_key"},
            "public_jwk": json.dumps(record.public_jwk),
            **asdict(record.private_key),
        }
        try:
            async with self.engine.begin() as connection:
                await connection.execute(sa.insert(signing_keys).values(**row))
        except IntegrityError:
            return False
        return True

    async def remove(self, kids: builtins.list[str]) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(sa.delete(signing_keys).where(signing_keys.c.kid.in_(kids)))

    async def reseal(self, kid: str, old: Sealed, new: Sealed) -> bool:
        """Put `new` in place of `old`, unless the key changed meanwhile."""
        return await _reseal(self.engine, signing_keys, signing_keys.c.kid == kid, old, new)


async def _reseal(
    engine: AsyncEngine, table: sa.Table, row: sa.ColumnElement[bool], old: Sealed, new: Sealed
) -> bool:
    statement = (
        sa.update(table)
        .where(row, table.c.key_id == old.key_id, table.c.sealed == old.sealed)
        .values(**asdict(new))
    )
    async with engine.begin() as connection:
        return bool((await connection.execute(statement)).rowcount)
