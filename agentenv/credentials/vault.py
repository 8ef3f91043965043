"""Hosted secrets (E2B's `Secret`): names, metadata and versions to read, values sealed
with the server key that only the egress placeholders (`placeholders.py`) open.

No route returns a value, no log line carries one, and a sandbox's record never holds
one: a sandbox names a secret (`${e2b.secrets.NAME}`) and its egress gets the value of
the moment, so an update reaches it at once and a deletion stops it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from ..errors import InvalidInput, NotFound
from ..state.credentials import SecretRecord, SecretStore
from .sealing import Sealer

# Ids start with it; names may not (names are checked for it lower-cased).
ID_PREFIX = "sec_"
MAX_NAME_CHARS = 128
MAX_VALUE_BYTES = 64 * 1024
# E2B's bounds on a secret's metadata (its OpenAPI's `SecretMetadata`).
MAX_METADATA_ENTRIES = 32
MAX_METADATA_KEY_BYTES = 128
MAX_METADATA_VALUE_BYTES = 1024
MAX_METADATA_BYTES = 8192
# What a name in a placeholder cannot hold, as the SDK refuses: a brace would end or open
# the placeholder early, a control character cannot go into a header.
_NOT_IN_NAMES = re.compile(r"[{}\x00-\x1f\x7f-\x9f]")


def _now() -> datetime:
    return datetime.now(UTC)


def usable_name(name: str) -> bool:
    """Whether a secret or identity token of this name can be named by a placeholder."""
    return bool(name) and not _NOT_IN_NAMES.search(name)


def canonical_name(name: str) -> str:
    """The name as stored (lower case); InvalidInput naming what is wrong with it."""
    canonical = name.lower()
    if not canonical:
        raise InvalidInput("secret name: must not be empty")
    if len(canonical) > MAX_NAME_CHARS:
        raise InvalidInput(f"secret name: at most {MAX_NAME_CHARS} characters")
    if not usable_name(canonical):
        raise InvalidInput("secret name: '{', '}' and control characters are not allowed")
    if canonical.startswith(ID_PREFIX):
        raise InvalidInput(f"secret name: the prefix '{ID_PREFIX}' is reserved for secret ids")
    return canonical


def _utf8(what: str, text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON can carry
        raise InvalidInput(f"{what}: not valid UTF-8") from None


def check_value(value: str) -> bytes:
    """The value's bytes; never quoted in an error."""
    encoded = _utf8("value", value)
    if not 0 < len(encoded) <= MAX_VALUE_BYTES:
        raise InvalidInput(f"value: 1 to {MAX_VALUE_BYTES} bytes")
    return encoded


def check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise InvalidInput(
            f"metadata: at most {MAX_METADATA_ENTRIES} entries, {len(metadata)} given"
        )
    total = 0
    for key, value in metadata.items():
        key_bytes, value_bytes = _utf8("metadata", key), _utf8("metadata", value)
        shown = key[:32]
        if not 0 < len(key_bytes) <= MAX_METADATA_KEY_BYTES:
            raise InvalidInput(f"metadata key {shown!r}: 1 to {MAX_METADATA_KEY_BYTES} bytes")
        if len(value_bytes) > MAX_METADATA_VALUE_BYTES:
            raise InvalidInput(
                f"metadata value of {shown!r}: at most {MAX_METADATA_VALUE_BYTES} bytes"
            )
        if "\x00" in key or "\x00" in value:
            raise InvalidInput(f"metadata entry {shown!r}: NUL bytes are not allowed")
        total += len(key_bytes) + len(value_bytes)
    if total > MAX_METADATA_BYTES:
        raise InvalidInput(f"metadata: at most {MAX_METADATA_BYTES} bytes in all, {total} given")


def _context(secret_id: str) -> str:
    return f"secret {secret_id}"


class SecretVault:
    """The secrets of a state store, their values sealed with the server key."""

    def __init__(
        self, store: SecretStore, sealer: Sealer, clock: Callable[[], datetime] = _now
    ) -> None:
        self.store = store
        self._sealer = sealer
        self._clock = clock

    async def create(self, name: str, value: str, metadata: dict[str, str]) -> SecretRecord:
        """Version 1; Conflict when the name is taken."""
        canonical = canonical_name(name)
        plaintext = check_value(value)
        check_metadata(metadata)
        secret_id = ID_PREFIX + uuid.uuid4().hex
        now = self._clock()
        record = SecretRecord(
            secret_id=secret_id,
            name=canonical,
            version=1,
            metadata=dict(metadata),
            created_at=now,
            updated_at=now,
            value=self._sealer.seal(plaintext, _context(secret_id)),
        )
        await self.store.insert(record)
        return record

    async def update(self, key: str, value: str, metadata: dict[str, str] | None) -> SecretRecord:
        """The next version, by id or name; its metadata replaced when given."""
        plaintext = check_value(value)
        if metadata is not None:
            check_metadata(metadata)
        record = await self.get(key)
        sealed = self._sealer.seal(plaintext, _context(record.secret_id))
        updated = await self.store.replace_value(record.secret_id, sealed, metadata, self._clock())
        if updated is None:
            raise NotFound(f"secret '{key}' not found")
        return updated

    async def get(self, key: str) -> SecretRecord:
        """By id, or by name in any case; NotFound otherwise."""
        record = await self._find(key)
        if record is None:
            raise NotFound(f"secret '{key}' not found")
        return record

    async def page(self, limit: int, after: tuple[datetime, str] | None) -> list[SecretRecord]:
        return await self.store.page(limit, after)

    async def delete(self, key: str) -> None:
        """From now on no placeholder resolves to it."""
        record = await self.get(key)
        if not await self.store.delete(record.secret_id):
            raise NotFound(f"secret '{key}' not found")

    async def value(self, name: str) -> str | None:
        """The current value of the secret `name` (any case); None: no such secret (an id
        is not a name)."""
        canonical = name.lower()
        record = None if canonical.startswith(ID_PREFIX) else await self.store.find(canonical)
        if record is None:
            return None
        return self._sealer.open(record.value, _context(record.secret_id)).decode()

    async def reseal(self) -> int:
        """Move values sealed with a former server key to the current one; how many moved."""
        moved = 0
        for record in await self.store.list():
            new = self._sealer.reseal(record.value, _context(record.secret_id))
            if new is not None and await self.store.reseal(record.secret_id, record.value, new):
                moved += 1
        return moved

    async def _find(self, key: str) -> SecretRecord | None:
        return await self.store.find(key if key.startswith(ID_PREFIX) else key.lower())
