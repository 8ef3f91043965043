"""The ASGI application: control-plane routes behind the sandbox proxy, with their lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import PlainTextResponse

from ..config import Config
from ..console.metrics import DensityHistory, DensityPoint, density_of, operation_histograms
from ..console.site import site_router
from ..credentials.sealing import server_sealer
from ..images.buildfiles import signing_key
from ..observe.logs import RequestIds
from ..observe.metrics import CONTENT_TYPE, exposition
from ..proxy.router import SandboxProxy
from ..runtime.node.assembly import Node, refresh_node_metrics
from ..runtime.sandboxes.routes import Route
from ..state.idempotency import SqlKeyStore
from . import (
    builds,
    identity,
    sandboxes,
    sandboxlogs,
    secrets,
    snapshots,
    storage,
    templates,
    templatetags,
    volumes,
)
from .auth import ApiKeyAuth, load_or_create_api_key
from .console import SandboxFeed, builds_router, console_router
from .deps import NodeDep
from .errors import install_error_handlers
from .idempotency import NODE, IdempotentOperations
from .limits import BodyLimit
from .models import Health
from .sandboxes import with_host_memory
from .teams import teams_router

log = logging.getLogger(__name__)


def build_api(cfg: Config, api_key: str, *, hollow: bool = False) -> FastAPI:
    """The FastAPI app; its lifespan starts the node runtime (`hollow`: over machines that
    start nothing, `Node.open`) and stops its background work."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sealer = server_sealer(cfg, api_key)
        node = await Node.open(cfg, signing_key(api_key), sealer=sealer, hollow=hollow)
        app.state.node = node
        app.state.idempotency = SqlKeyStore(node.nodes.engine)
        app.state.density = DensityHistory(lambda: _density(node))
        sampler = asyncio.create_task(app.state.density.run())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await node.close()

    app = FastAPI(title="AgentENV", version="0.1.0", lifespan=lifespan)
    app.state.config = cfg
    # Inside the body limit: a keyed request's body is bounded before it is read whole.
    app.add_middleware(IdempotentOperations, role=NODE)
    app.add_middleware(
        BodyLimit, max_bytes=cfg.server.max_body_bytes, streamed=(builds.UPLOADS, volumes.CONTENT)
    )
    install_error_handlers(app)

    @app.get("/health", tags=["node"])
    async def health(node: NodeDep) -> Health:
        return Health(
            status="ok",
            sandboxes=len(await node.manager.list()),
            accelerator=node.accelerator.name,
        )

    @app.get("/metrics", tags=["node"], response_class=PlainTextResponse)
    async def metrics(node: NodeDep) -> Response:
        """Prometheus exposition: operations, sandboxes by state, capacity, chunk cache."""
        await refresh_node_metrics(node)
        return Response(exposition(), media_type=CONTENT_TYPE)

    protected = APIRouter(dependencies=[Depends(ApiKeyAuth(api_key))])
    protected.include_router(console_router(_node_feed, _node_metrics))
    protected.include_router(builds_router())
    protected.include_router(sandboxes.router)
    protected.include_router(sandboxlogs.router)
    protected.include_router(snapshots.router)
    protected.include_router(storage.router)
    # Before the template routes: `DELETE /templates/tags` is not a template named "tags".
    protected.include_router(templatetags.router)
    protected.include_router(templates.router)
    protected.include_router(builds.router)
    protected.include_router(volumes.router)
    protected.include_router(secrets.router)
    protected.include_router(identity.router)
    protected.include_router(teams_router(api_key))
    app.include_router(protected)
    app.include_router(site_router())
    # What verifiers of workload identity tokens fetch: public, as OIDC's are.
    app.include_router(identity.public_router(identity.node_keys))
    # The volume's own token is the credential, not the API key.
    app.include_router(volumes.content)
    # Signed in their URL, as presigned uploads are: the SDKs send them no API key.
    app.include_router(builds.uploads)
    return app


def _node_feed(request: Request) -> SandboxFeed:
    """The console's list on a node: its own sandboxes, with their host memory."""
    node: Node = request.app.state.node
    return SandboxFeed(node.manager.store, everyone=False, annotate=partial(with_host_memory, node))


async def _density(node: Node) -> DensityPoint:
    return density_of([await node.capacity()])


async def _node_metrics(request: Request) -> dict[str, Any]:
    """The console's metrics on a node: its own operations and density."""
    return {"operations": operation_histograms(), "density": request.app.state.density.points()}


def create_app(cfg: Config, *, hollow: bool = False) -> Any:
    """API plus data-plane proxy; prints a newly generated API key once."""
    api_key, created = load_or_create_api_key(cfg.server.api_key, cfg.home)
    if created:
        print(f"Generated API key (stored under {cfg.home}/secrets): {api_key}", flush=True)
    api = build_api(cfg, api_key, hollow=hollow)

    def resolve(sandbox_id: str) -> Route | None:
        node: Node | None = getattr(api.state, "node", None)
        return node.manager.routes.get(sandbox_id) if node else None

    async def wake(sandbox_id: str) -> Route | None:
        node: Node | None = getattr(api.state, "node", None)
        return await node.pauses.wake_on_traffic(sandbox_id) if node else None

    def routes() -> Iterable[tuple[str, Route]]:
        node: Node | None = getattr(api.state, "node", None)
        return node.manager.routes.items() if node else ()

    return RequestIds(SandboxProxy(api, resolve, cfg.server.domain, wake, routes))
