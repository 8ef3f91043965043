"""An undo stack: push an undo right after acquiring a resource, run them all on failure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Undo = Callable[[], Awaitable[object]]


class CleanupStack:
    """Runs undos once, in reverse order, shielded from cancellation; collects every error."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._undos: list[tuple[str, Undo]] = []
        self._ran = False

    def push(self, name: str, undo: Undo) -> None:
        self._undos.append((name, undo))

    def dismiss(self) -> None:
        """The operation succeeded: the resources now belong to their owner."""
        self._undos.clear()

    async def run(self) -> list[Exception]:
        if self._ran:
            return []
        self._ran = True
        return await asyncio.shield(self._run_all())

    async def _run_all(self) -> list[Exception]:
        errors: list[Exception] = []
        while self._undos:
            name, undo = self._undos.pop()
            try:
                await undo()
            except Exception as exc:
                log.error("%s: undo %s failed: %s", self._what, name, exc)
                errors.append(exc)
        return errors
