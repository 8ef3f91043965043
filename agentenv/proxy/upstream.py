"""HTTP clients to sandbox guests, one per sandbox.

Sandbox addresses are reused (a slot's namespace address outlives its sandbox), so a
shared connection pool would hand a new sandbox the idle keep-alive connections of the
one before it, which lead nowhere. A client per sandbox, dropped with it, cannot.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import httpx

from ..runtime.sandboxes.routes import Route
from ..wire import ENVD_PORT


def _guest_tls() -> ssl.SSLContext:
    """TLS to a guest's HTTPS port without verifying its certificate, as E2B's proxy does:
    a sandbox's service has a self-signed one (or none a CA would sign for its address)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# One for every client: making a context per sandbox would cost each its setup.
GUEST_TLS = _guest_tls()


class UpstreamClients:
    """The client for each live sandbox; clients of gone sandboxes are closed lazily."""

    def __init__(self, resolve: Callable[[str], Route | None]) -> None:
        self._resolve = resolve
        self._clients: dict[str, tuple[Route, httpx.AsyncClient]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, sandbox_id: str, route: Route) -> httpx.AsyncClient:
        entry = self._clients.get(sandbox_id)
        if entry is not None and entry[0] is route:
            return entry[1]
        self._drop_stale()

        async def note_agent(response: httpx.Response) -> None:
            if response.url.port == ENVD_PORT:
                route.agent.answered()

        client = httpx.AsyncClient(
            # Guests are on this host: an HTTP(S)_PROXY set for the server's own egress
            # must not carry sandbox traffic off it.
            trust_env=False,
            verify=GUEST_TLS,
            timeout=httpx.Timeout(connect=5.0, read=None, write=None, pool=10.0),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=20),
            event_hooks={"response": [note_agent]},
        )
        self._clients[sandbox_id] = (route, client)
        return client

    def _drop_stale(self) -> None:
        for sandbox_id, (route, client) in list(self._clients.items()):
            if self._resolve(sandbox_id) is not route:
                del self._clients[sandbox_id]
                task = asyncio.ensure_future(client.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        clients = [client for _, client in self._clients.values()]
        self._clients.clear()
        await asyncio.gather(*(c.aclose() for c in clients), *self._closing)
