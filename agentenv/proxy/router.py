"""Data plane: requests carrying `E2b-Sandbox-Id` go to that sandbox's guest port, streamed."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx
from yarl import URL

from ..errors import DependencyFailed, ErrorAnswer, error_answer
from ..runtime.sandboxes.routes import Route
from ..wire import (
    ACCESS_TOKEN_HEADER,
    ENVD_FILES_ROUTE,
    ENVD_HEALTH_ROUTE,
    ENVD_PORT,
    TRAFFIC_TOKEN_HEADER,
)
from .isolation import isolated
from .signedurl import signer_target
from .stream import (
    HOP_BY_HOP,
    Receive,
    Scope,
    Send,
    has_body,
    request_body,
    send_error,
    stream_through,
)
from .target import ROUTING_HEADERS, BadTarget, Target, find_target
from .upstream import UpstreamClients
from .websocket import bridge_websocket

TRAFFIC_TOKEN = TRAFFIC_TOKEN_HEADER.lower().encode()
_ACCESS_TOKEN = ACCESS_TOKEN_HEADER.lower().encode()

# Hop-by-hop headers and our routing and access headers never travel on.
_DROP_REQUEST = HOP_BY_HOP | ROUTING_HEADERS | {b"host", TRAFFIC_TOKEN}


class SandboxProxy:
    """ASGI middleware in front of the API: routes sandbox traffic, passes the rest on."""

    def __init__(
        self,
        app: Any,
        resolve: Callable[[str], Route | None],
        domain: str = "",
        wake: Callable[[str], Awaitable[Route | None]] | None = None,
        routes: Callable[[], Iterable[tuple[str, Route]]] = lambda: (),
    ) -> None:
        self.app = app
        self._resolve = resolve
        # Every running sandbox's route: finds the signer of a URL that names no sandbox.
        self._routes = routes
        # For a sandbox with no route: resumes it if it asked to be woken by traffic.
        self._wake = wake
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
        try:
            target = target_of(scope, self._domain)
        except BadTarget as exc:
            await refuse(scope, send, ErrorAnswer(400, str(exc)))
            return
        if target is None and scope["type"] == "http":
            target = signer_target(scope["method"], request_target(scope) or "", self._routes)
        if target is None:
            await self.app(scope, receive, send)
            return
        route = self._resolve(target.sandbox_id)
        if route is None and self._wake is not None:
            try:
                route = await self._wake(target.sandbox_id)
            except DependencyFailed as exc:
                # The VMM (or another host part) failed to wake it: a 503 naming the part.
                await refuse(scope, send, error_answer(exc))
                return
        if route is None:
            await refuse(
                scope, send, ErrorAnswer(502, f"The sandbox {target.sandbox_id} was not found")
            )
            return
        if (
            route.access_token
            and target.port == ENVD_PORT
            and not _token_ok(scope, target, headers, route.access_token)
        ):
            await refuse(
                scope,
                send,
                ErrorAnswer(401, f"missing or invalid {ACCESS_TOKEN_HEADER} for this sandbox"),
            )
            return
        if (
            route.traffic_token
            and target.port != ENVD_PORT
            and not hmac.compare_digest(
                headers.get(TRAFFIC_TOKEN, b""), route.traffic_token.encode()
            )
        ):
            # The sandbox's own ports are private: E2B's `allowPublicTraffic: false`.
            await refuse(
                scope, send, ErrorAnswer(403, f"missing or invalid {TRAFFIC_TOKEN_HEADER.lower()}")
            )
            return
        if target.shares_origin(headers):
            send = isolated(send)
        if scope["type"] == "websocket":
            hostport = f"{route.host}:{target.port}"
            secure = route.scheme(target.port) == "https"
            await bridge_websocket(scope, receive, send, hostport, target.path, secure)
        else:
            await self._forward(scope, receive, send, target, route, headers)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: Target,
        route: Route,
        headers: dict[bytes, bytes],
    ) -> None:
        url = f"{route.scheme(target.port)}://{route.host}:{target.port}{target.path}"
        forward_headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROP_REQUEST]
        if route.mask_host and target.port != ENVD_PORT:
            masked = route.mask_host.replace("${PORT}", str(target.port))
            forward_headers.append((b"host", masked.encode()))
        if b"content-length" in headers:
            forward_headers.append((b"content-length", headers[b"content-length"]))
        client = self._upstreams.get(target.sandbox_id, route)
        request = client.build_request(
            scope["method"],
            url,
            headers=forward_headers,
            content=request_body(receive) if has_body(headers) else b"",
        )

        def unreachable(exc: httpx.HTTPError) -> str:
            return f"port {target.port} is not open in sandbox {target.sandbox_id}: {exc}"

        def alive() -> bool:
            return self._resolve(target.sandbox_id) is route

        await stream_through(client, request, receive, send, unreachable, scope, alive)

    def _closing_on_shutdown(self, send: Send) -> Send:
        async def send_and_close(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self._upstreams.aclose()
            await send(message)

        return send_and_close


async def refuse(scope: Scope, send: Send, answer: ErrorAnswer) -> None:
    if scope["type"] == "websocket":
        # Closing before accepting makes the server answer the upgrade with 403.
        await send({"type": "websocket.close", "code": 1008, "reason": answer.message[:120]})
    else:
        await send_error(send, answer)


def target_of(scope: Scope, domain: str) -> Target | None:
    """The sandbox port a request is for (None: it is an API request); BadTarget when it
    names a sandbox but no usable port or path."""
    raw_path = request_target(scope)
    target = find_target(dict(scope["headers"]), raw_path or "", domain)
    # It is appended to the guest's address: `*` (OPTIONS *) would make it a port.
    if target is not None and not (raw_path or "").startswith("/"):
        raise BadTarget("the request path must be ASCII and begin with '/'")
    return target


def request_target(scope: Scope) -> str | None:
    """Path and query exactly as the client sent them; None if they are not ASCII."""
    try:
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("ascii")
        query = scope.get("query_string", b"").decode("ascii")
    except UnicodeDecodeError:
        return None
    return f"{raw_path}?{query}" if query else raw_path


def _token_ok(scope: Scope, target: Target, headers: dict[bytes, bytes], token: str) -> bool:
    """The envd access token guards the agent's port only (other ports are the user's own
    servers, public as on E2B); its health check stays open, as the agent's is."""
    given = headers.get(_ACCESS_TOKEN, b"")
    if hmac.compare_digest(given, token.encode()):
        return True
    # The open routes must be spelt plainly: the path is forwarded as sent and the agent
    # decodes it, so `/envs%3F/files` (the agent's `/envs?/files`) or `/%66iles` never
    # count as `/files`; a plain path reads the same before and after decoding.
    path, _, query = target.path.partition("?")
    if scope.get("method") == "GET" and path == ENVD_HEALTH_ROUTE:
        return True
    # Signed /files URLs carry no header; the agent verifies their signature itself. The
    # query is split by yarl, as the agent's aiohttp splits it.
    signed = "signature" in URL.build(query_string=query, encoded=True).query
    return path == ENVD_FILES_ROUTE and signed
