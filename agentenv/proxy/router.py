"""Data plane: requests carrying `E2b-Sandbox-Id` go to that sandbox's guest port, streamed."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from ..runtime.manager import AGENT_PORT, Route

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

    def __init__(self, app: Any, resolve: Callable[[str], Route | None]) -> None:
        self.app = app
        self._resolve = resolve
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=5.0, read=None, write=None, pool=10.0),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        sandbox_id = headers.get(b"e2b-sandbox-id")
        if sandbox_id is None:
            await self.app(scope, receive, send)
            return
        await self._forward(scope, receive, send, sandbox_id.decode(), headers)

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, sandbox_id: str, headers: dict
    ) -> None:
        route = self._resolve(sandbox_id)
        if route is None:
            await _send_error(send, 502, f"The sandbox {sandbox_id} was not found")
            return
        try:
            port = int(headers.get(b"e2b-sandbox-port", str(AGENT_PORT).encode()))
            if not 0 < port < 65536:
                raise ValueError
        except ValueError:
            await _send_error(send, 400, "E2b-Sandbox-Port must be a TCP port number")
            return
        if route.access_token and not _token_ok(scope, headers, route.access_token):
            await _send_error(send, 401, "missing or invalid X-Access-Token for this sandbox")
            return
        path = scope.get("raw_path") or scope["path"].encode()
        url = f"http://{route.host}:{port}{path.decode()}"
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode()
        forward_headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROP_REQUEST]
        has_body = b"content-length" in headers or b"transfer-encoding" in headers
        if b"content-length" in headers:
            forward_headers.append((b"content-length", headers[b"content-length"]))
        request = self._client.build_request(
            scope["method"],
            url,
            headers=forward_headers,
            content=_request_body(receive) if has_body else b"",
        )
        try:
            upstream = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _send_error(send, 502, f"port {port} is not open in sandbox {sandbox_id}: {exc}")
            return
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
            log.warning("proxy stream from %s broke: %s", sandbox_id, exc)
        finally:
            await upstream.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


def _token_ok(scope: Scope, headers: dict, token: str) -> bool:
    given = headers.get(b"x-access-token", b"")
    if hmac.compare_digest(given, token.encode()):
        return True
    # Signed /files URLs carry no header; the agent verifies their signature itself.
    return scope["path"] == "/files" and b"signature=" in scope.get("query_string", b"")


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
