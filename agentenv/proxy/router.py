"""Data plane: requests carrying `E2b-Sandbox-Id` go to that sandbox's guest port, streamed."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from yarl import URL

from ..runtime.manager import AGENT_PORT, Route
from .target import BadTarget, Target, find_target
from .upstream import UpstreamClients
from .websocket import bridge_websocket

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]

# Connection-scoped headers (RFC 9110 §7.6.1) and our routing headers never travel on.
_DROP_REQUEST = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
    b"e2b-sandbox-id", b"e2b-sandbox-port",
}  # fmt: skip
_DROP_RESPONSE = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"content-length",
}  # fmt: skip


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"code": status, "message": message}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class SandboxProxy:
    """ASGI middleware in front of the API: routes sandbox traffic, passes the rest on."""

    def __init__(self, app: Any, resolve: Callable[[str], Route | None], domain: str = "") -> None:
        self.app = app
        self._resolve = resolve
        self._domain = domain
        self._upstreams = UpstreamClients(resolve)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_on_shutdown(send))
            return
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        raw_path = _request_target(scope)
        try:
            target = find_target(headers, raw_path or "", self._domain)
            # It is appended to the guest's address: `*` (OPTIONS *) would make it a port.
            if target is not None and not (raw_path or "").startswith("/"):
                raise BadTarget("the request path must be ASCII and begin with '/'")
        except BadTarget as exc:
            await _refuse(scope, send, 400, str(exc))
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        route = self._resolve(target.sandbox_id)
        if route is None:
            await _refuse(scope, send, 502, f"The sandbox {target.sandbox_id} was not found")
            return
        if (
            route.access_token
            and target.port == AGENT_PORT
            and not _token_ok(scope, target, headers, route.access_token)
        ):
            await _refuse(scope, send, 401, "missing or invalid X-Access-Token for this sandbox")
            return
        if scope["type"] == "websocket":
            await bridge_websocket(scope, receive, send, f"{route.host}:{target.port}", target.path)
        else:
            await self._forward(scope, receive, send, target, route, headers)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        route: Route,
        headers: dict,
    ) -> None:
        url = f"http://{route.host}:{target.port}{target.path}"
        forward_headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROP_REQUEST]
        has_body = b"content-length" in headers or b"transfer-encoding" in headers
        if b"content-length" in headers:
            forward_headers.append((b"content-length", headers[b"content-length"]))
        client = self._upstreams.get(target.sandbox_id, route)
        request = client.build_request(
            scope["method"],
            url,
            headers=forward_headers,
            content=_request_body(receive) if has_body else b"",
        )
        try:
            upstream = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            message = f"port {target.port} is not open in sandbox {target.sandbox_id}: {exc}"
            await _send_error(send, 502, message)
            return
        # The request body is sent by now. A client that goes away mid-stream (an aborted
        # WatchDir or command stream) must end the upstream stream too: the server's `send`
        # drops data silently after a disconnect, so without this the copy would wait on the
        # guest forever (and, once the sandbox is gone, on a dead address with no timeout).
        relay = asyncio.ensure_future(self._relay(send, upstream, target))
        gone = asyncio.ensure_future(_client_gone(receive))
        try:
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            relay.cancel()
            gone.cancel()
            await asyncio.gather(relay, gone, return_exceptions=True)
            await upstream.aclose()
        if relay.done() and not relay.cancelled() and relay.exception() is not None:
            raise relay.exception()

    async def _relay(self, send: Send, upstream: httpx.Response, target: Target) -> None:
        try:
            await send({
                "type": "http.response.start",
                "status": upstream.status_code,
                "headers": [
                    (k, v) for k, v in upstream.headers.raw if k.lower() not in _DROP_RESPONSE
                ],
            })  # fmt: skip
            async for chunk in upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except httpx.HTTPError as exc:
            log.warning("proxy stream from %s broke: %s", target.sandbox_id, exc)

    def _closing_on_shutdown(self, send: Send) -> Send:
        async def send_and_close(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self._upstreams.aclose()
            await send(message)

        return send_and_close


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":
        # Closing before accepting makes the server answer the upgrade with 403.
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
    else:
        await _send_error(send, status, message)


def _request_target(scope: Scope) -> str | None:
    """Path and query exactly as the client sent them; None if they are not ASCII."""
    try:
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("ascii")
        query = scope.get("query_string", b"").decode("ascii")
    except UnicodeDecodeError:
        return None
    return f"{raw_path}?{query}" if query else raw_path


def _token_ok(scope: Scope, target: Target, headers: dict, token: str) -> bool:
    """The envd access token guards the agent's port only (other ports are the user's own
    servers, public as on E2B); its health check stays open, as the agent's is."""
    given = headers.get(b"x-access-token", b"")
    if hmac.compare_digest(given, token.encode()):
        return True
    # The open routes must be spelt plainly: the path is forwarded as sent and the agent
    # decodes it, so `/envs%3F/files` (the agent's `/envs?/files`) or `/%66iles` never
    # count as `/files`; a plain path reads the same before and after decoding.
    path, _, query = target.path.partition("?")
    if scope.get("method") == "GET" and path == "/health":
        return True
    # Signed /files URLs carry no header; the agent verifies their signature itself. The
    # query is split by yarl, as the agent's aiohttp splits it.
    signed = "signature" in URL.build(query_string=query, encoded=True).query
    return path == "/files" and signed


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return
