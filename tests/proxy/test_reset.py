"""A proxied answer cut off because its sandbox is gone reaches the client as a reset."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from agentenv.proxy.reset import ClientConnections


async def test_the_clients_connection_is_reset_mid_answer() -> None:
    connections = ClientConnections()
    cut = asyncio.Event()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        cut.set()
        assert connections.reset(scope)
        assert not connections.reset({"client": ("203.0.113.1", 1)})

    server = uvicorn.Server(uvicorn.Config(app, log_config=None))
    connections.attach(server.server_state)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    # Connections queue on the listening socket until the server takes them.
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        try:
            while chunk := await asyncio.wait_for(reader.read(65536), 10):
                received += chunk
            reset = False
        except ConnectionResetError:
            reset = True
        assert cut.is_set() and reset, received
        writer.close()
    finally:
        server.should_exit = True
        await serving
    assert not connections.reset({"client": None})
