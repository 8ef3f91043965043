"""`aenv server --role control`: the E2B-compatible API and data plane in front of nodes.

Lists, sandbox details and the identity JWKS are answered from the state store; a create
goes to the node placement picks; an operation on a sandbox goes to the node that holds it
(moving a paused one off a lost or draining node first); anything else (templates,
builds, snapshot lists, secrets) goes to one live node. Sandbox traffic (header, host or
`/proxy/` path addressed) is relayed to the owning node's proxy in the path form,
streamed both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask

from ..api.auth import ApiKeyAuth, load_or_create_api_key
from ..api.builds import UPLOADS
from ..api.console import METRICS, SandboxFeed, console_router
from ..api.errors import error_response, install_error_handlers
from ..api.idempotency import CONTROL, IdempotentOperations
from ..api.identity import public_router
from ..api.limits import BodyLimit, InFlightLimit
from ..api.listing import ListQuery, list_query, listed_page_of, running_listed
from ..api.models import ListedSandbox, SandboxDetail, SandboxesWithMetrics
from ..api.sandboxes import public_domain, sandbox_detail
from ..api.volumes import CONTENT
from ..config import Config
from ..console.metrics import DensityHistory, DensityPoint, Histograms, density_of, merged
from ..console.site import site_router
from ..credentials.identity import IdentitySettings, PublicKeys
from ..errors import ErrorAnswer, NotFound
from ..observe.logs import RequestIds
from ..observe.metrics import (
    CONTENT_TYPE,
    NODES,
    RELAYED,
    SANDBOXES,
    exposition,
    set_counts,
)
from ..proxy.router import refuse, target_of
from ..proxy.stream import HOP_BY_HOP, has_body, request_body, stream_through
from ..proxy.target import ADDRESSED_BY, ROUTING_HEADERS, BadTarget
from ..proxy.websocket import bridge_websocket
from ..state.credentials import SqlSigningKeyStore
from ..state.idempotency import SqlKeyStore
from ..state.lifecycle import State
from ..state.lost import LostSandbox
from ..state.nodes import NodeEvent, NodeInfo, NodeState
from ..state.sandboxes import open_engine
from ..wire import API_KEY_HEADER
from .plane import ControlPlane

# Headers a relayed API request does not carry on (httpx sets its own framing and host).
_DROP = HOP_BY_HOP | {b"host"}
_SANDBOX_PATH = re.compile(r"^/(?:v2/|unstable/)?sandboxes/([^/]+)(?:/.*)?$")
# Seconds the data plane trusts what it looked up about a sandbox's node.
_ROUTE_TTL = 2.0
# Routes served past the bound on requests in flight: an operator's view of the plane.
UNCOUNTED = ("/health", "/metrics")


def _forwarded(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k.lower() not in _DROP}


def _plane(request: Request) -> ControlPlane:
    plane: ControlPlane = request.app.state.plane
    return plane


Plane = Annotated[ControlPlane, Depends(_plane)]


async def _live_density(plane: ControlPlane) -> DensityPoint:
    return density_of(n.capacity for n in await plane.live_nodes())


async def _every_nodes_metrics(request: Request) -> dict[str, Any]:
    """The console's metrics behind a control plane: every live node's operations as one,
    and the fleet's density as sampled here."""
    plane = _plane(request)
    key = {API_KEY_HEADER: request.headers.get(API_KEY_HEADER, "")}

    async def of(node: NodeInfo) -> Histograms:
        try:
            answer = await plane.client.get(node.url + METRICS, headers=key, timeout=5.0)
            answer.raise_for_status()
            operations: Histograms = answer.json()["operations"]
            return operations
        except (httpx.HTTPError, ValueError, KeyError):
            return {}  # a node that cannot say now is left out of this answer

    parts = await asyncio.gather(*(of(n) for n in await plane.live_nodes()))
    return {"operations": merged(parts), "density": request.app.state.density.points()}


def _every_nodes_feed(request: Request) -> SandboxFeed:
    """The console's list behind a control plane: every node's sandboxes, from the store."""
    return SandboxFeed(_plane(request).sandboxes, everyone=True)


def build_control_api(cfg: Config, api_key: str) -> FastAPI:
    """The control plane's FastAPI app; its lifespan opens the state store."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await open_engine(cfg.state_url, cfg.state.max_connections)
        app.state.identity = PublicKeys(SqlSigningKeyStore(engine), identity_settings)
        timeout = httpx.Timeout(connect=5.0, read=None, write=None, pool=10.0)
        async with httpx.AsyncClient(trust_env=False, timeout=timeout) as client:
            plane = ControlPlane(cfg, engine, client)
            app.state.plane = plane
            app.state.idempotency = SqlKeyStore(engine)
            watcher = asyncio.create_task(plane.watch())
            app.state.density = DensityHistory(lambda: _live_density(plane))
            sampler = asyncio.create_task(app.state.density.run())
            try:
                yield
            finally:
                for task in (watcher, sampler):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await engine.dispose()

    identity_settings = IdentitySettings.of(cfg)
    app = FastAPI(title="AgentENV control plane", version="0.1.0", lifespan=lifespan)
    # A client's key is honoured here too (then passed on to the node): a retry of a
    # request whose relay is lost, or whose control replica died, finds its answer.
    app.add_middleware(IdempotentOperations, role=CONTROL)
    app.add_middleware(BodyLimit, max_bytes=cfg.server.max_body_bytes, streamed=(UPLOADS, CONTENT))
    # Outermost: a request past the bound is answered before its body is read.
    app.add_middleware(InFlightLimit, limit=cfg.server.max_in_flight, exempt=UNCOUNTED)
    install_error_handlers(app)

    @app.get("/health", tags=["control"])
    async def health(plane: Plane) -> dict[str, Any]:
        live = await plane.live_nodes()
        return {"status": "ok", "role": "control", "nodes": len(live)}

    @app.get("/metrics", tags=["control"], response_class=PlainTextResponse)
    async def metrics(plane: Plane) -> Response:
        """Prometheus exposition: nodes and sandboxes by state, requests relayed."""
        nodes: dict[str, int] = {}
        for node in await plane.nodes.list():
            nodes[node.state] = nodes.get(node.state, 0) + 1
        set_counts(NODES, nodes, tuple(NodeState))
        counts = await plane.sandboxes.count_by_state()
        sandboxes = {state.value: count for state, count in counts.items()}
        set_counts(SANDBOXES, sandboxes, tuple(state.value for state in State))
        return Response(exposition(), media_type=CONTENT_TYPE)

    # Verifiers of workload identity tokens: from the store, with no node and no API key.
    app.include_router(public_router(lambda request: request.app.state.identity))
    protected = APIRouter(dependencies=[Depends(ApiKeyAuth(api_key))])
    protected.include_router(console_router(_every_nodes_feed, _every_nodes_metrics))

    @protected.get("/nodes")
    async def list_nodes(plane: Plane) -> list[dict[str, Any]]:
        now = time.time()
        return [_node_view(n, now) for n in await plane.nodes.list()]

    @protected.post("/nodes/{name}/drain", status_code=204)
    async def drain_node(plane: Plane, name: str) -> Response:
        if await plane.nodes.fire(name, NodeEvent.DRAIN) is None:
            raise NotFound(f"node '{name}' not found")
        return Response(status_code=204)

    @protected.post("/nodes/{name}/activate", status_code=204)
    async def activate_node(plane: Plane, name: str) -> Response:
        """Undo a drain: the node takes new sandboxes again (a lost one has to restart)."""
        if await plane.nodes.fire(name, NodeEvent.ACTIVATE) is None:
            raise NotFound(f"node '{name}' not found")
        return Response(status_code=204)

    @protected.delete("/nodes/{name}", status_code=204)
    async def remove_node(plane: Plane, name: str) -> Response:
        """Forget a node; its sandboxes are settled as a lost node's are."""
        if await plane.nodes.fire(name, NodeEvent.LOSE) is None:
            raise NotFound(f"node '{name}' not found")
        await plane.settle_lost_nodes()
        await plane.nodes.remove(name)
        return Response(status_code=204)

    @protected.get("/lost-sandboxes")
    async def list_lost_sandboxes(plane: Plane) -> list[dict[str, Any]]:
        """Not E2B's: the sandboxes lost nodes took with them, newest first."""
        return [_lost_view(lost) for lost in await plane.lost.list()]

    @protected.get("/v2/sandboxes")
    async def list_sandboxes_v2(
        plane: Plane, response: Response, query: Annotated[ListQuery, Depends(list_query)]
    ) -> list[ListedSandbox]:
        return await listed_page_of(plane.sandboxes.page, response, query)

    @protected.get("/sandboxes")
    async def list_sandboxes_v1(plane: Plane, metadata: str | None = None) -> list[ListedSandbox]:
        return running_listed(await plane.visible_sandboxes(), metadata)

    @protected.get("/sandboxes/metrics", response_model_exclude_none=True)
    async def many_sandboxes_metrics(
        plane: Plane, request: Request, sandbox_ids: str
    ) -> SandboxesWithMetrics:
        """Asked of each node that runs some of them; merged."""
        return await plane.metrics_of(sandbox_ids, _forwarded(request.headers.raw))

    @protected.get("/sandboxes/{sandbox_id}", response_model_exclude_none=True)
    async def get_sandbox(plane: Plane, sandbox_id: str) -> SandboxDetail:
        return sandbox_detail(await plane.visible_sandbox(sandbox_id), public_domain(cfg))

    @protected.post("/sandboxes")
    @protected.post("/v2/sandboxes")
    async def create_sandbox(plane: Plane, request: Request) -> Response:
        headers = _forwarded(request.headers.raw)
        answer = await plane.create(request.url.path, await request.body(), headers)
        RELAYED.labels("create", str(answer.status_code)).inc()
        return Response(
            answer.content,
            status_code=answer.status_code,
            headers=_forwarded(answer.headers.raw),
        )

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]

    @protected.api_route("/{path:path}", methods=methods, include_in_schema=False)
    async def relay(plane: Plane, request: Request) -> Response:
        match = _SANDBOX_PATH.match(request.url.path)
        if match:
            headers = _forwarded(request.headers.raw)
            node = await plane.node_for_operation(match.group(1), headers)
            return await _relay(plane, request, node, "sandbox")
        return await _relay(plane, request, await plane.any_node(), "other")

    # Signed in its URL (by a node: they share the key), so no API key: the SDKs send none.
    @app.put(UPLOADS + "{files_hash}", include_in_schema=False)
    async def relay_upload(plane: Plane, request: Request, files_hash: str) -> Response:
        return await _relay(plane, request, await plane.any_node(), "upload")

    # A volume's files: its own token is the credential (checked by the node holding them).
    @app.api_route(CONTENT + "{rest:path}", methods=methods, include_in_schema=False)
    async def relay_volume_content(plane: Plane, request: Request, rest: str) -> Response:
        return await _relay(plane, request, await plane.any_node(), "volume")

    app.include_router(site_router())
    app.include_router(protected)
    return app


async def _relay(plane: ControlPlane, request: Request, node: NodeInfo, kind: str) -> Response:
    """The request to `node` as it came (its body streamed), and the answer back; the node
    learns the address the client used, for URLs it hands out."""
    headers = _forwarded(request.headers.raw)
    headers["X-Forwarded-Host"] = request.headers.get("host", "")
    headers["X-Forwarded-Proto"] = request.url.scheme
    url = node.url + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    with_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    upstream_request = plane.client.build_request(
        request.method, url, headers=headers, content=request.stream() if with_body else b""
    )
    try:
        upstream = await plane.client.send(upstream_request, stream=True)
    except httpx.HTTPError as exc:
        RELAYED.labels(kind, "502").inc()
        return error_response(ErrorAnswer(502, f"node {node.name} cannot be reached: {exc}"))
    RELAYED.labels(kind, str(upstream.status_code)).inc()
    return StreamingResponse(
        upstream.aiter_raw(),
        status_code=upstream.status_code,
        headers=_forwarded(upstream.headers.raw),
        background=BackgroundTask(upstream.aclose),
    )


def _node_view(node: NodeInfo, now: float) -> dict[str, Any]:
    return {
        "name": node.name,
        "url": node.url,
        "state": node.state,
        "heartbeatAgeSeconds": round(node.silent_for(now), 1),
        "capacity": node.capacity.__dict__,
    }


def _lost_view(lost: LostSandbox) -> dict[str, Any]:
    return {
        "sandboxID": lost.sandbox_id,
        "templateID": lost.template_id,
        "node": lost.node,
        "state": lost.state,
        "reason": lost.reason,
        "lostAt": datetime.fromtimestamp(lost.lost_at, UTC).isoformat(),
        "metadata": lost.metadata,
    }


class ControlProxy:
    """Sandbox traffic to the node that runs the sandbox; everything else to the API."""

    def __init__(self, app: FastAPI, domain: str) -> None:
        self.app = app
        self._domain = domain
        self._routes: dict[str, tuple[float, str]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        try:
            target = target_of(scope, self._domain)
        except BadTarget as exc:
            await refuse(scope, send, ErrorAnswer(400, str(exc)))
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        node_url = await self._node_url(target.sandbox_id)
        if node_url is None:
            await refuse(
                scope, send, ErrorAnswer(502, f"The sandbox {target.sandbox_id} was not found")
            )
            return
        # The node's proxy routes the path form; its token checks still apply there.
        path = f"/proxy/{target.sandbox_id}/{target.port}{target.path}"
        if scope["type"] == "websocket":
            await bridge_websocket(scope, receive, send, node_url.split("://", 1)[1], path)
            return
        plane: ControlPlane = self.app.state.plane
        forward = [
            (k, v)
            for k, v in scope["headers"]
            if k.lower() not in _DROP and k.lower() not in ROUTING_HEADERS
        ]
        # The node sandboxes what a client reached by path (`proxy/isolation.py`).
        forward.append((ADDRESSED_BY, b"path" if target.by_path else b"other"))
        if b"content-length" in headers:
            forward.append((b"content-length", headers[b"content-length"]))
        request = plane.client.build_request(
            scope["method"],
            node_url + path,
            headers=forward,
            content=request_body(receive) if has_body(headers) else b"",
        )

        def unreachable(exc: httpx.HTTPError) -> str:
            return f"the node of sandbox {target.sandbox_id} cannot be reached: {exc}"

        RELAYED.labels("data", "-").inc()
        # A node that resets its side (the sandbox is gone) has the client's reset too.
        await stream_through(plane.client, request, receive, send, unreachable, scope)

    async def _node_url(self, sandbox_id: str) -> str | None:
        now = time.monotonic()
        cached = self._routes.get(sandbox_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        plane: ControlPlane = self.app.state.plane
        try:
            node = await plane.node_of(sandbox_id)
        except NotFound:
            return None
        if len(self._routes) > 10_000:
            self._routes = {k: v for k, v in self._routes.items() if v[0] > now}
        self._routes[sandbox_id] = (now + _ROUTE_TTL, node.url)
        return node.url


def create_control_app(cfg: Config) -> Any:
    """The control plane: API plus data plane; prints a newly generated API key once."""
    api_key, created = load_or_create_api_key(cfg.server.api_key, cfg.home)
    if created:
        print(f"Generated API key (stored under {cfg.home}/secrets): {api_key}", flush=True)
    return RequestIds(ControlProxy(build_control_api(cfg, api_key), cfg.server.domain))
