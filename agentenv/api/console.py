"""The console's own API routes: its sandbox list as one event stream (`console/events`),
over a node's records or, behind a control plane, every node's; its metrics; a node's
builds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..console.events import HEADERS, list_events
from ..state.sandboxes import SandboxStore
from .deps import BuildsDep
from .listing import listed_fields
from .models import ListedSandbox

EVENTS = "/console/api/sandboxes/events"
METRICS = "/console/api/metrics"
# A node's own: a control plane relays it to the node builds go to.
BUILDS = "/console/api/builds"


@dataclass(frozen=True)
class SandboxFeed:
    """Sandboxes as listed (`GET /v2/sandboxes`' rows), this node's or `everyone`'s;
    `annotate` adds what only the answering process knows (a node's host memory)."""

    store: SandboxStore
    everyone: bool
    annotate: Callable[[list[ListedSandbox]], list[ListedSandbox]] = lambda rows: rows

    async def versions(self) -> Mapping[str, Hashable]:
        return await self.store.versions(self.everyone)

    async def rows(self, ids: list[str]) -> list[dict[str, Any]]:
        records = [r for r in await self.store.many(ids) if r.state.visible]
        listed = self.annotate([ListedSandbox(**listed_fields(r)) for r in records])
        return [row.model_dump(mode="json") for row in listed]


def console_router(
    feed_of: Callable[[Request], SandboxFeed],
    metrics_of: Callable[[Request], Awaitable[dict[str, Any]]],
) -> APIRouter:
    """The console's routes (its list stream, its metrics), behind the caller's API-key
    dependency."""
    router = APIRouter(include_in_schema=False)

    @router.get(METRICS)
    async def console_metrics(request: Request) -> dict[str, Any]:
        """`operations`: latency histograms; `density`: the last hour's samples."""
        return await metrics_of(request)

    @router.get(EVENTS)
    async def sandbox_events(request: Request) -> StreamingResponse:
        return StreamingResponse(
            list_events(feed_of(request)), media_type="text/event-stream", headers=HEADERS
        )

    return router


def builds_router() -> APIRouter:
    """`GET /console/api/builds`: this node's template builds kept in memory, newest first
    (their logs: `GET /templates/{id}/builds/{build}/status`)."""
    router = APIRouter(include_in_schema=False)

    @router.get(BUILDS)
    async def recent_builds(builds: BuildsDep) -> list[dict[str, Any]]:
        return [
            {
                "templateID": b.template_id,
                "buildID": b.build_id,
                "status": b.status,
                "createdAt": b.created_at,
                "finishedAt": b.finished_at,
                "reason": b.reason,
            }
            for b in builds.tracker.recent()
        ]

    return router
