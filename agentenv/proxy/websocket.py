"""WebSocket upgrades bridged to a guest port, message by message, in both directions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from .target import ROUTING_HEADERS
from .upstream import GUEST_TLS

log = logging.getLogger(__name__)

# Headers the client library sets itself for the upstream handshake.
_HANDSHAKE = ROUTING_HEADERS | {
    b"host", b"connection", b"upgrade", b"sec-websocket-key", b"sec-websocket-version",
    b"sec-websocket-extensions", b"sec-websocket-protocol", b"content-length",
}  # fmt: skip


async def bridge_websocket(
    scope: dict[str, Any], receive: Any, send: Any, hostport: str, path: str, secure: bool = False
) -> None:
    """Open the guest's WebSocket first (over TLS, unverified, when `secure`), then accept
    the client's, then pump until one closes."""
    if (await receive())["type"] != "websocket.connect":
        return
    # Latin-1, as HTTP reads header bytes: any byte decodes, so no header can fail the bridge.
    headers = {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in scope["headers"]
        if k.lower() not in _HANDSHAKE
    }
    async with aiohttp.ClientSession() as session:
        try:
            upstream = await session.ws_connect(
                f"{'wss' if secure else 'ws'}://{hostport}{path}",
                ssl=GUEST_TLS,  # used by wss:// alone
                headers=headers,
                protocols=tuple(scope.get("subprotocols", ())),
                autoping=True,
            )
        except aiohttp.ClientError as exc:
            log.info("websocket to %s%s refused: %s", hostport, path, exc)
            await send({"type": "websocket.close", "code": 1011})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.protocol})
        to_guest = asyncio.create_task(_client_to_guest(receive, upstream))
        try:
            async for message in upstream:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await send({"type": "websocket.send", "text": message.data})
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await send({"type": "websocket.send", "bytes": message.data})
                else:
                    break
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": upstream.close_code or 1000})
        finally:
            to_guest.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await to_guest
            await upstream.close()


async def _client_to_guest(receive: Any, upstream: aiohttp.ClientWebSocketResponse) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await upstream.close(code=message.get("code", 1000))
            return
        if message.get("bytes") is not None:
            await upstream.send_bytes(message["bytes"])
        elif message.get("text") is not None:
            await upstream.send_str(message["text"])
