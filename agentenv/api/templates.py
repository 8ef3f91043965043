"""Template routes: E2B's listing and alias lookups, and pulling an OCI image (native)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..config import Config
from ..errors import AenvError, Conflict
from ..images.catalog import BASE, TemplateCatalog
from ..images.reference import parse_reference
from ..images.snapshots import split_ref
from ..images.templates import TemplateRecord
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
    return {
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


async def _all(catalog: TemplateCatalog, cfg: Config) -> list[dict[str, Any]]:
    records = await asyncio.to_thread(catalog.templates.list)
    return [_base_json(cfg)] + [template_json(r, cfg) for r in records]


@router.get("/v2/templates")
async def list_templates_v2(catalog: CatalogDep, cfg: ConfigDep) -> list[dict[str, Any]]:
    return await _all(catalog, cfg)


@router.get("/templates")
async def list_templates(catalog: CatalogDep, cfg: ConfigDep) -> list[dict[str, Any]]:
    return await _all(catalog, cfg)


@router.get("/templates/aliases/{alias}")
async def template_alias(catalog: CatalogDep, alias: str) -> dict[str, Any]:
    if alias != BASE:
        await asyncio.to_thread(catalog.templates.get, alias)
    return {"templateID": alias, "public": alias == BASE}


@router.get("/templates/{template_id}")
async def get_template(catalog: CatalogDep, cfg: ConfigDep, template_id: str) -> dict[str, Any]:
    if template_id == BASE:
        return _base_json(cfg)
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
    if ":" in template_id or await asyncio.to_thread(snapshots.registry.builds, name):
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
        except AenvError as exc:
            await queue.put({"error": {"code": exc.status, "message": exc.message}})
        except Exception as exc:
            await queue.put({"error": {"code": 500, "message": f"pull failed: {exc}"}})
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
