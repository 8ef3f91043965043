"""Template routes: E2B's listing and alias lookups, and pulling an OCI image (native)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..config import Config
from ..errors import Conflict, error_answer
from ..images.base import load_base_template
from ..images.catalog import BASE, TemplateCatalog
from ..images.reference import parse_reference
from ..images.snapshots import TEMPLATE, SnapshotRecord, SnapshotRegistry, split_ref
from ..images.templates import TemplateRecord
from ..runtime.snapshots.named import SandboxSnapshots
from .deps import CatalogDep, ConfigDep, PullerDep, SnapshotsDep
from .errors import ERROR_RESPONSES

router = APIRouter(responses=ERROR_RESPONSES)


class PullBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1, max_length=512)
    name: str | None = Field(default=None, max_length=63)


def template_json(record: TemplateRecord, cfg: Any) -> dict[str, Any]:
    """E2B's `Template` fields, plus where the template came from."""
    return {
        "templateID": record.template_id,
        "buildID": record.digest,
        "aliases": [record.template_id],
        "names": [record.template_id],
        "public": False,
        "cpuCount": record.vcpus or cfg.sandbox.vcpus,
        "memoryMB": record.memory_mb or cfg.sandbox.memory_mb,
        "diskSizeMB": record.size // 2**20,
        "createdAt": record.created_at,
        "updatedAt": record.created_at,
        "buildStatus": "ready",
        "source": record.source,
        "layers": record.layers,
    }


def _base_json(cfg: Any) -> dict[str, Any]:
    base = load_base_template(cfg)
    built = datetime.fromtimestamp(base.rootfs.stat().st_mtime, UTC) if base else None
    return {
        "createdAt": built.isoformat() if built else None,
        "updatedAt": built.isoformat() if built else None,
        "templateID": BASE,
        "buildID": BASE,
        "aliases": [BASE],
        "names": [BASE],
        "public": True,
        "cpuCount": cfg.sandbox.vcpus,
        "memoryMB": cfg.sandbox.memory_mb,
        "diskSizeMB": cfg.sandbox.disk_size_mb,
        "buildStatus": "ready",
        "source": "debian:bookworm (built in)",
    }


def built_template_json(build: SnapshotRecord, cfg: Any) -> dict[str, Any]:
    """E2B's `Template` fields for a template built from steps (its newest build)."""
    return {
        "templateID": build.name,
        "buildID": build.build_uuid,
        "aliases": [build.name],
        "names": [build.name],
        "public": False,
        "cpuCount": build.vcpus,
        "memoryMB": build.memory_mb,
        "diskSizeMB": cfg.sandbox.disk_size_mb,
        "createdAt": build.created_at,
        "updatedAt": build.created_at,
        "buildStatus": "ready",
        "source": f"steps on {build.template_id}",
    }


def _built(registry: SnapshotRegistry) -> list[SnapshotRecord]:
    """The newest build of each template built from steps."""
    newest: dict[str, SnapshotRecord] = {}
    for record in registry.list():  # oldest first
        if record.kind == TEMPLATE:
            newest[record.name] = record
    return list(newest.values())


async def _all(
    catalog: TemplateCatalog, snapshots: SandboxSnapshots, cfg: Config
) -> list[dict[str, Any]]:
    records = await asyncio.to_thread(catalog.templates.list)
    built = await asyncio.to_thread(_built, snapshots.registry)
    return (
        [_base_json(cfg)]
        # `base` published for a cluster's nodes is a record too; it is listed once.
        + [template_json(r, cfg) for r in records if r.template_id != BASE]
        + [built_template_json(b, cfg) for b in built]
    )


@router.get("/v2/templates")
async def list_templates_v2(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep
) -> list[dict[str, Any]]:
    return await _all(catalog, snapshots, cfg)


@router.get("/templates")
async def list_templates(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep
) -> list[dict[str, Any]]:
    return await _all(catalog, snapshots, cfg)


async def _built_template(snapshots: SandboxSnapshots, name: str) -> SnapshotRecord | None:
    """The newest build of `name` when it is a template built from steps."""
    builds = await asyncio.to_thread(snapshots.registry.builds, name)
    return builds[-1] if builds and builds[-1].kind == TEMPLATE else None


@router.get("/templates/aliases/{alias}")
async def template_alias(
    catalog: CatalogDep, snapshots: SnapshotsDep, alias: str
) -> dict[str, Any]:
    if alias != BASE and await _built_template(snapshots, alias) is None:
        await asyncio.to_thread(catalog.templates.get, alias)
    return {"templateID": alias, "public": alias == BASE}


@router.get("/templates/{template_id}")
async def get_template(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep, template_id: str
) -> dict[str, Any]:
    if template_id == BASE:
        return _base_json(cfg)
    if (built := await _built_template(snapshots, template_id)) is not None:
        return built_template_json(built, cfg)
    record = await asyncio.to_thread(catalog.templates.get, template_id)
    return template_json(record, cfg)


@router.delete("/templates/{template_id}", status_code=204)
async def delete_template(
    catalog: CatalogDep, snapshots: SnapshotsDep, template_id: str
) -> Response:
    """A template, or a snapshot: `name` (every build) or `name:tag` (one), as E2B's SDK
    deletes snapshots; sandboxes made from a snapshot keep their own copies."""
    if template_id == BASE:
        raise Conflict("the built-in 'base' template cannot be deleted")
    name, _ = split_ref(template_id)
    if ":" in template_id or bool(await asyncio.to_thread(snapshots.registry.builds, name)):
        await snapshots.delete(template_id)
    else:
        await asyncio.to_thread(catalog.templates.delete, template_id)
    return Response(status_code=204)


@router.post("/templates/pull")
async def pull_template(puller: PullerDep, cfg: ConfigDep, body: PullBody) -> StreamingResponse:
    """Pull an OCI image into a template; streams NDJSON progress, then the template."""
    ref = parse_reference(body.image)
    # Resolve up front so a missing image or bad credentials get their own status.
    await asyncio.to_thread(puller.registry.resolve, ref)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def progress(line: str) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, {"progress": line})

    async def run() -> None:
        try:
            record = await asyncio.to_thread(puller.pull, str(ref), body.name, progress)
            await queue.put({"template": template_json(record, cfg)})
        except Exception as exc:
            await queue.put({"error": error_answer(exc).body()})
        finally:
            await queue.put(None)

    async def lines() -> AsyncIterator[bytes]:
        task = asyncio.create_task(run())
        try:
            while (item := await queue.get()) is not None:
                yield json.dumps(item).encode() + b"\n"
        finally:
            # The pull goes on if the client leaves; its result lands in the registry.
            await asyncio.shield(task)

    return StreamingResponse(lines(), media_type="application/x-ndjson")
