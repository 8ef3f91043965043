"""Resetting a client's connection (TCP RST) when the sandbox behind its stream is gone.

Closing normally in the middle of a chunked answer reads, to an HTTP client, as a protocol
error; a reset reads as a dropped connection, which is what the E2B SDKs take to mean
"check whether the sandbox still lives" (and then report it killed). ASGI gives an app no
socket, so the server's connections are looked up by the client's address.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Protocol

# SO_LINGER on with a zero timeout: close() discards unsent data and sends RST.
_LINGER_ZERO = struct.pack("ii", 1, 0)


class ServerState(Protocol):
    """uvicorn's state shared by a server's protocols: the open connections."""

    connections: set[Any]


class ClientConnections:
    """The serving process's client connections, once the server is attached."""

    def __init__(self) -> None:
        self._state: ServerState | None = None

    def attach(self, state: ServerState) -> None:
        self._state = state

    def reset(self, scope: dict[str, Any]) -> bool:
        """Reset the connection `scope`'s request came on; False if it is not found."""
        client = scope.get("client")
        if self._state is None or client is None:
            return False
        for protocol in list(self._state.connections):
            transport: asyncio.Transport | None = getattr(protocol, "transport", None)
            if transport is None or getattr(protocol, "client", None) != tuple(client):
                continue
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            transport.abort()
            return True
        return False


# One server per process (`aenv server`); the proxy resets through it.
CLIENT_CONNECTIONS = ClientConnections()
