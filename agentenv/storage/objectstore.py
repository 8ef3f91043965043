"""The object store interface: where image layers and snapshot layers live durably.

Blocking by design: the server calls it from worker threads (`asyncio.to_thread`) and the
block daemon from its FUSE worker threads. Keys are `/`-separated relative paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import DependencyFailed


class ObjectNotFound(KeyError):
    """The key does not exist in the store."""


class ObjectStoreError(DependencyFailed):
    """The store failed (I/O, network, credentials); the message names key and cause. A
    client gets 503."""

    part = "the object store"


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key` atomically: readers see the old object or the new one."""
        ...

    def put_file(self, key: str, path: Path) -> None:
        """Store a local file's content under `key` atomically, streaming it."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object; ObjectNotFound if absent."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer only at the end of the object)."""
        ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """Object size in bytes; ObjectNotFound if absent."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key`; absent keys are not an error."""
        ...

    def list(self, prefix: str) -> list[str]:
        """All keys starting with `prefix`, sorted."""
        ...

    def ages(self, prefix: str) -> dict[str, float]:
        """Seconds since each key starting with `prefix` was last written."""
        ...
