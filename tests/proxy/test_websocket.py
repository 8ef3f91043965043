"""WebSocket bridging: whatever bytes a client's headers carry, the bridge answers."""

from __future__ import annotations

import socket
from typing import Any

from agentenv.proxy.websocket import bridge_websocket


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_non_utf8_headers_do_not_break_the_bridge() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "headers": [(b"x-odd", b"\xff\xfe"), (b"host", b"x")]}
    await bridge_websocket(scope, receive, send, f"127.0.0.1:{closed_port()}", "/")
    # The guest port is closed: the client is refused as it would be for any header.
    assert sent == [{"type": "websocket.close", "code": 1011}]
