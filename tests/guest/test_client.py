"""The host's agent client against a stand-in agent on loopback."""

from __future__ import annotations

import asyncio

from agentenv.guest.client import CONNECT_TIMEOUT, AgentClient

# Longer than a health poll's connection wait: the answer of a restored guest on a loaded host.
SLOW_ANSWER = CONNECT_TIMEOUT + 0.5


async def _slow_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readline()
    await asyncio.sleep(SLOW_ANSWER)
    writer.write(b"HTTP/1.0 204 No Content\r\n\r\n")
    await writer.drain()
    writer.close()


async def test_a_connected_health_poll_waits_as_long_as_it_is_told() -> None:
    server = await asyncio.start_server(_slow_agent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    agent = AgentClient(f"http://127.0.0.1:{port}")
    async with server:
        assert not await agent.healthy()  # a liveness check gives up at once
        assert await agent.healthy(answer_within=SLOW_ANSWER + 5)


async def test_a_health_poll_with_nobody_listening_is_false_at_once() -> None:
    server = await asyncio.start_server(_slow_agent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert not await AgentClient(f"http://127.0.0.1:{port}").healthy(answer_within=60)
    assert loop.time() - start < CONNECT_TIMEOUT
