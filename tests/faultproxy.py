"""A fault injector: an HTTP proxy between a client and a server that forwards each
request and then, as a test's rule says, hands the answer on, answers 502 in its place
(the answer was lost) or drops the connection without an answer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from agentenv.cluster.postgres import free_port

# What becomes of the server's answer to a request.
PASS, LOSE, DROP = "pass", "lose", "drop"
_HOP_BY_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class Exchange:
    """One request that went through, and what the server answered it."""

    method: str
    path: str
    headers: dict[str, str]
    sent_at: float
    status: int = 0
    answer_headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    answered_at: float = 0.0
    fault: str = PASS


class FaultProxy:
    """Listens on a loopback port in a thread of its own; `rule(exchange, earlier)` says
    what becomes of each answer (`earlier`: the exchanges before it)."""

    def __init__(self, upstream: str, rule: Callable[[Exchange, list[Exchange]], str]) -> None:
        self.upstream = upstream
        self.rule = rule
        self.port = free_port()
        self.exchanges: list[Exchange] = []
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def of(self, method: str, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if (e.method, e.path) == (method, path)]

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        assert self._runner is not None
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        exchange = Exchange(request.method, request.path, headers, time.monotonic())
        earlier = list(self.exchanges)
        self.exchanges.append(exchange)
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
            timeout=aiohttp.ClientTimeout(total=300),
        ) as answer:
            exchange.body = await answer.read()
            exchange.status = answer.status
            exchange.answer_headers = {k.lower(): v for k, v in answer.headers.items()}
        exchange.answered_at = time.monotonic()
        exchange.fault = self.rule(exchange, earlier)
        if exchange.fault == LOSE:
            return web.Response(status=502, text="the fault injector lost the answer")
        if exchange.fault == DROP:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        kept = {k: v for k, v in exchange.answer_headers.items() if k.lower() not in _HOP_BY_HOP}
        return web.Response(status=exchange.status, body=exchange.body, headers=kept)


def first_create(fault: str) -> Callable[[Exchange, list[Exchange]], str]:
    """`fault` for the first create that goes through; every other answer passes."""

    def rule(exchange: Exchange, earlier: list[Exchange]) -> str:
        creates = [e for e in earlier if _is_create(e)]
        return fault if _is_create(exchange) and not creates else PASS

    return rule


def _is_create(exchange: Exchange) -> bool:
    return exchange.method == "POST" and exchange.path in ("/sandboxes", "/v2/sandboxes")
