"""Snapshot routes: E2B's `POST /sandboxes/{id}/snapshots` and `GET /snapshots`, and
rollback (native). Deleting goes through `DELETE /templates/{id}`, as in E2B."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response

from ..images.snapshots import SNAPSHOT, SnapshotRecord, newest_tags, snapshot_names, split_ref
from ..runtime.snapshots.named import SandboxSnapshots
from .deps import ConfigDep, SnapshotsDep
from .errors import ERROR_RESPONSES
from .models import RollbackBody, Sandbox, SnapshotBody, SnapshotInfo
from .pagination import decode_cursor, encode_cursor
from .sandboxes import public_domain, sandbox_answer

router = APIRouter(responses=ERROR_RESPONSES)


def _info(snapshots: SandboxSnapshots, snapshot: SnapshotRecord, newest: bool) -> SnapshotInfo:
    return SnapshotInfo(
        snapshotID=snapshot.snapshot_id,
        names=snapshot_names(snapshot, newest),
        sandboxID=snapshot.source_sandbox,
        templateID=snapshot.template_id,
        memory=snapshot.memory,
        sizeBytes=snapshot.size,
        createdAt=snapshot.created,
        status="stored" if snapshot.stored else "uploading",
        uploadError=snapshots.uploads.errors.get(snapshot.snapshot_id),
    )


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create_snapshot(
    snapshots: SnapshotsDep, sandbox_id: str, body: SnapshotBody | None = None
) -> SnapshotInfo:
    """Snapshot a running sandbox, which runs on; a name that exists gets a new build."""
    body = body or SnapshotBody()
    snapshot = await snapshots.take(sandbox_id, body.name, body.memory)
    newest = await asyncio.to_thread(snapshots.registry.find, snapshot.name)
    return _info(snapshots, snapshot, newest is not None and newest.tag == snapshot.tag)


@router.get("/snapshots")
async def list_snapshots(
    snapshots: SnapshotsDep,
    response: Response,
    sandboxID: str | None = None,
    name: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
    nextToken: str | None = None,
) -> list[SnapshotInfo]:
    """Every build, oldest first; filtered by source sandbox or by name (`name[:tag]`)."""
    found = [s for s in await asyncio.to_thread(snapshots.registry.list) if s.kind == SNAPSHOT]
    newest = newest_tags(found)
    if sandboxID is not None:
        found = [s for s in found if s.source_sandbox == sandboxID]
    if name is not None:
        wanted, tag = split_ref(name)
        found = [s for s in found if s.name == wanted and (":" not in name or s.tag == tag)]
    if nextToken:
        cursor = decode_cursor(nextToken)
        found = [s for s in found if (s.created, s.snapshot_id) > cursor]
    page = found[:limit]
    if len(found) > limit:
        response.headers["x-next-token"] = encode_cursor(page[-1].created, page[-1].snapshot_id)
    return [_info(snapshots, s, newest[s.name] == s.tag) for s in page]


@router.post("/sandboxes/{sandbox_id}/rollback")
async def rollback_sandbox(
    snapshots: SnapshotsDep, cfg: ConfigDep, sandbox_id: str, body: RollbackBody
) -> Sandbox:
    """Put a running or paused sandbox back to a snapshot in place; it runs afterwards."""
    record = await snapshots.rollback(sandbox_id, body.snapshotID)
    return sandbox_answer(record, public_domain(cfg))
