"""The bound on requests in flight: past it, 429 with Retry-After at once, never a wait."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentenv.api.limits import InFlightLimit

Message = dict[str, Any]


class Held:
    """An app whose requests stay in flight until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.arrived: asyncio.Queue[str] = asyncio.Queue()

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        self.arrived.put_nowait(scope["path"])
        await self.release.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def request(limit: InFlightLimit, path: str = "/v2/sandboxes") -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await limit({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send)
    return sent


async def test_past_the_bound_a_request_is_429_at_once_and_health_still_answers() -> None:
    app = Held()
    limit = InFlightLimit(app, limit=2, exempt=("/health",))
    held = [asyncio.create_task(request(limit)) for _ in range(2)]
    for _ in held:
        await app.arrived.get()
    refused = await asyncio.wait_for(request(limit), 1)
    assert refused[0]["status"] == 429
    assert (b"retry-after", b"1") in refused[0]["headers"]
    body = json.loads(refused[1]["body"])
    assert body["code"] == 429 and "2 requests at once" in body["message"]
    health = asyncio.create_task(request(limit, "/health"))
    assert await app.arrived.get() == "/health"
    app.release.set()
    assert [s[0]["status"] for s in await asyncio.gather(*held, health)] == [204, 204, 204]
    # Answered requests leave the bound: the next one is served.
    assert (await request(limit))[0]["status"] == 204
    assert limit.in_flight == 0
