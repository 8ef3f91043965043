"""One operation at a time per sandbox: its lock, the operation under way (which a kill
cancels) and the background readers of its paused files (which the next operation stops)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from ...errors import Conflict

T = TypeVar("T")


class OperationGate:
    """Locks, running operations and readers of a node's sandboxes."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._operations: dict[str, asyncio.Task[Any]] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def forget(self, sandbox_id: str) -> None:
        """A killed sandbox's lock goes with it."""
        self._locks.pop(sandbox_id, None)

    async def run_killable(self, sandbox_id: str, body: Awaitable[T]) -> T:
        """Run `body` as a task that `cancel` may stop; a cancel surfaces as 409."""
        task = asyncio.ensure_future(body)
        self._operations[sandbox_id] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise Conflict(f"sandbox '{sandbox_id}' was killed meanwhile") from None
        finally:
            self._operations.pop(sandbox_id, None)

    def cancel(self, sandbox_id: str) -> bool:
        """Cancel the operation under way on a sandbox; whether there was one."""
        operation = self._operations.get(sandbox_id)
        if operation is not None:
            operation.cancel()
        return operation is not None

    def read_paused(self, sandbox_id: str, body: Awaitable[None]) -> asyncio.Task[None]:
        """Run `body`, which reads a paused sandbox's files, until the next operation on
        the sandbox: that cancels it first, so nothing reads files a guest changes."""
        task = asyncio.ensure_future(body)
        self._readers[sandbox_id] = task
        task.add_done_callback(lambda _: self._readers.pop(sandbox_id, None))
        return task

    async def stop_reader(self, sandbox_id: str) -> None:
        reader = self._readers.get(sandbox_id)
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
