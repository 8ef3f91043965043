"""Streaming one HTTP exchange through to an upstream (a guest port, or a node behind
the control plane): request body in, response out, until either side goes away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from ..errors import ErrorAnswer
from .reset import CLIENT_CONNECTIONS

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]

# Connection-scoped headers (RFC 9110 §7.6.1) never travel on.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"content-length",
})  # fmt: skip


async def send_error(send: Send, answer: ErrorAnswer) -> None:
    """An error as the API gives them: JSON `{"code", "message"}` and its retry advice."""
    for event in answer.asgi_messages():
        await send(event)


def has_body(headers: dict[bytes, bytes]) -> bool:
    return b"content-length" in headers or b"transfer-encoding" in headers


async def request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def stream_through(
    client: httpx.AsyncClient,
    request: httpx.Request,
    receive: Receive,
    send: Send,
    unreachable: Callable[[httpx.HTTPError], str],
    scope: Scope,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Send `request` and stream the answer to the client of `scope`; 502 with
    `unreachable(error)` when the upstream cannot be reached. The client's connection is
    reset when the upstream breaks mid-answer, or once `alive()` turns false (the sandbox
    was killed or paused: a killed guest's network is gone without a reset, and its
    streams would otherwise hang). A reset reads as a dropped connection, so the SDKs
    probe the sandbox and report it killed; a plain close mid-answer reads as a protocol
    error."""
    try:
        upstream = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        await send_error(send, ErrorAnswer(502, unreachable(exc)))
        return
    # The request body is sent by now. A client that goes away mid-stream (an aborted
    # WatchDir or command stream) must end the upstream stream too: the server's `send`
    # drops data silently after a disconnect, so without this the copy would wait on the
    # upstream forever (and, once it is gone, on a dead address with no timeout).
    relay = asyncio.ensure_future(_relay(send, upstream, str(request.url)))
    gone = asyncio.ensure_future(_client_gone(receive))
    ended = asyncio.ensure_future(_until_dead(alive))
    try:
        await asyncio.wait({relay, gone, ended}, return_when=asyncio.FIRST_COMPLETED)
        finished = relay.done() and not relay.cancelled() and relay.exception() is None
        upstream_broke = finished and not relay.result()
        if upstream_broke or (ended.done() and not relay.done()):
            CLIENT_CONNECTIONS.reset(scope)
    finally:
        for task in (relay, gone, ended):
            task.cancel()
        await asyncio.gather(relay, gone, ended, return_exceptions=True)
        await upstream.aclose()
    if relay.done() and not relay.cancelled() and (error := relay.exception()) is not None:
        raise error


async def _until_dead(alive: Callable[[], bool], every: float = 1.0) -> None:
    # Polled: routes change under the manager's own locks, with no event to wait on.
    while True:
        if not alive():
            return
        await asyncio.sleep(every)


async def _relay(send: Send, upstream: httpx.Response, source: str) -> bool:
    """Copy the answer; False when the upstream broke before its end."""
    try:
        await send({
            "type": "http.response.start",
            "status": upstream.status_code,
            "headers": [(k, v) for k, v in upstream.headers.raw if k.lower() not in HOP_BY_HOP],
        })  # fmt: skip
        async for chunk in upstream.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return True
    except httpx.HTTPError as exc:
        log.warning("stream from %s broke: %s", source, exc)
        return False
