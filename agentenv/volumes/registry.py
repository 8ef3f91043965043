"""Volumes in the state store: id, unique name and the content API's token."""

from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import Conflict, InvalidInput, NotFound, PermanentlyUnavailable, Unavailable
from ..state.schema import volumes

# E2B's pattern for a volume's name, with a length bound of ours.
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
# NFS export ids are 16 bits; 0 is the NFSv4 pseudo root's.
_EXPORT_IDS = range(1, 65536)
_EXPORT_ID_TRIES = 5


@dataclass(frozen=True)
class VolumeRecord:
    volume_id: str
    name: str
    token: str
    created_at: float
    export_id: int


def _record(row: sa.Row[Any]) -> VolumeRecord:
    return VolumeRecord(**dict(row._mapping))


class VolumeRegistry:
    """The `volumes` table of a state store."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def create(self, name: str) -> VolumeRecord:
        if not _NAME.match(name):
            raise InvalidInput(
                f"volume name {name!r}: 1 to 128 letters, digits, '_' or '-' are allowed"
            )
        for _ in range(_EXPORT_ID_TRIES):
            try:
                async with self.engine.begin() as connection:
                    taken = set(
                        (await connection.execute(sa.select(volumes.c.export_id))).scalars()
                    )
                    export_id = next((i for i in _EXPORT_IDS if i not in taken), None)
                    if export_id is None:
                        raise PermanentlyUnavailable(
                            f"at most {len(_EXPORT_IDS)} volumes can exist"
                        )
                    record = VolumeRecord(
                        str(uuid.uuid4()), name, secrets.token_urlsafe(32), time.time(), export_id
                    )
                    await connection.execute(sa.insert(volumes).values(**record.__dict__))
                return record
            except IntegrityError:
                if await self._named(name):
                    raise Conflict(f"a volume named '{name}' already exists") from None
                # Another create took the same export id first: pick again.
        raise Unavailable("could not allocate an export id for the volume; try again")

    async def _named(self, name: str) -> bool:
        async with self.engine.connect() as connection:
            query = sa.select(volumes.c.volume_id).where(volumes.c.name == name)
            return (await connection.execute(query)).first() is not None

    async def list(self) -> list[VolumeRecord]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(sa.select(volumes).order_by(volumes.c.created_at))
            return [_record(row) for row in rows]

    async def get(self, volume_id: str) -> VolumeRecord:
        """By id (or, for the SDKs' mounts, by name); NotFound otherwise."""
        query = sa.select(volumes).where(
            sa.or_(volumes.c.volume_id == volume_id, volumes.c.name == volume_id)
        )
        async with self.engine.connect() as connection:
            rows = list(await connection.execute(query))
        if not rows:
            raise NotFound(f"volume '{volume_id}' not found")
        return _record(rows[0])

    async def delete(self, volume_id: str) -> VolumeRecord:
        record = await self.get(volume_id)
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.delete(volumes).where(volumes.c.volume_id == record.volume_id)
            )
        return record
