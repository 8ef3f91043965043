"""The egress proxy in-process over loopback: who it serves, and how many at once."""

from __future__ import annotations

import asyncio

from agentenv.net.egressproxy import EgressProxy
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import parse_egress

RULES = parse_egress(["allowed.test"], ["0.0.0.0/0"])


async def _closed_at_once(port: int, request: bytes) -> bool:
    """Whether the proxy ends a connection sending `request` without answering."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:  # closed with the request unread
        return True
    finally:
        writer.close()


async def test_only_sandboxes_under_their_limit_are_served() -> None:
    rules_of = {"127.0.0.1": ("sandbox", RULES)}
    proxy = EgressProxy(rules_of.get, EgressPolicy(), "10.250.0.0/16", max_per_sandbox=2)
    ports = await proxy.start("127.0.0.1")
    try:
        # A name the rules do not allow: closed unanswered.
        assert await _closed_at_once(ports.http, b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        # Two connections still reading their request are the most one sandbox may hold.
        held = [await asyncio.open_connection("127.0.0.1", ports.http) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert await _closed_at_once(ports.http, b"")
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.2)
        # Released: a third may come (and is refused on its name, not on the count).
        assert await _closed_at_once(ports.http, b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        # Not a sandbox at all: nothing is served.
        rules_of.clear()
        assert await _closed_at_once(ports.tls, b"\x16\x03\x01")
    finally:
        await proxy.close()
