"""A list kept current in the browser by one server-sent event stream: the whole list
once (`snapshot`), then only what changed (`change`: rows upserted, ids removed).

Each tick reads the list's versions (a narrow read) and fetches whole rows only for ids
whose version moved, so an idle list of ten thousand costs one small read a second.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Any, Protocol

# Seconds between reads of the list, and at most between two writes to an idle stream
# (a comment line, so proxies and browsers keep it open).
TICK_SECONDS = 1.0
KEEPALIVE_SECONDS = 15.0
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class ListFeed(Protocol):
    """A list as the stream reads it."""

    async def versions(self) -> Mapping[str, Hashable]: ...

    async def rows(self, ids: list[str]) -> list[dict[str, Any]]: ...


def event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def list_events(
    feed: ListFeed, tick: float = TICK_SECONDS, keepalive: float = KEEPALIVE_SECONDS
) -> AsyncIterator[bytes]:
    """The stream's bytes, until the client goes (the response cancels this)."""
    sent: Mapping[str, Hashable] = {}
    first = True
    quiet_since = time.monotonic()
    while True:
        now = await feed.versions()
        moved = [i for i, version in now.items() if sent.get(i) != version]
        removed = [i for i in sent if i not in now]
        if first:
            yield event("snapshot", {"sandboxes": await feed.rows(moved)})
            first = False
            quiet_since = time.monotonic()
        elif moved or removed:
            yield event("change", {"upsert": await feed.rows(moved), "remove": removed})
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= keepalive:
            yield b": keepalive\n\n"
            quiet_since = time.monotonic()
        sent = now
        await asyncio.sleep(tick)
