"""Template routes: E2B's listing, alias lookups and publishing, and pulling an OCI image
(native). `public` changes no access on a server with one API key: `docs/templates.md`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..config import Config
from ..errors import Conflict, InvalidInput, error_answer
from ..guest.agent import ENVD_VERSION
from ..images.base import load_base_template
from ..images.catalog import BASE, BASE_SOURCE, TemplateCatalog
from ..images.reference import parse_reference
from ..images.snapshots import TEMPLATE, SnapshotRecord, SnapshotRegistry, split_ref
from ..images.templates import TemplateRecord, build_uuid
from ..runtime.memory.admission import max_vcpus
from ..runtime.snapshots.named import SandboxSnapshots
from .deps import CatalogDep, ConfigDep, PullerDep, SnapshotsDep
from .errors import ERROR_RESPONSES
from .pagination import decode_name_cursor, encode_name_cursor

router = APIRouter(responses=ERROR_RESPONSES)


class PullBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1, max_length=512)
    name: str | None = Field(default=None, max_length=63)


def _template(
    template_id: str,
    build_id: str,
    public: bool,
    size: tuple[int, int, int],
    created: str | None,
    builds: int,
    most_vcpus: int,
    **native: Any,
) -> dict[str, Any]:
    """E2B's `Template` (usage is not tracked: no creator, no spawns), plus `native` fields;
    a create may ask for up to `most_vcpus` CPUs."""
    vcpus, memory_mb, disk_mb = size
    return {
        "templateID": template_id,
        "buildID": build_id,
        "aliases": [template_id],
        "names": [template_id],
        "public": public,
        "cpuCount": vcpus,
        "maxCpuCount": most_vcpus,
        "memoryMB": memory_mb,
        "diskSizeMB": disk_mb,
        "createdAt": created,
        "updatedAt": created,
        "createdBy": None,
        "lastSpawnedAt": None,
        "spawnCount": 0,
        "buildCount": builds,
        "envdVersion": ENVD_VERSION,
        "buildStatus": "ready",
        **native,
    }


def template_json(record: TemplateRecord, cfg: Config, public: bool) -> dict[str, Any]:
    """A pulled template (one build), with where it came from."""
    size = (
        record.vcpus or cfg.sandbox.vcpus,
        record.memory_mb or cfg.sandbox.memory_mb,
        record.size // 2**20,
    )
    return _template(
        record.template_id, record.build_uuid, public, size, record.created_at, 1,
        max_vcpus(cfg.sandbox),
        source=record.source, digest=record.digest, layers=record.layers,
    )  # fmt: skip


def base_build(cfg: Config) -> tuple[str, str | None]:
    """`base`'s one build (its id, when it was built), by the version on this node."""
    base = load_base_template(cfg)
    if base is None:
        return build_uuid(f"{BASE}@none"), None
    built = datetime.fromtimestamp(base.rootfs.stat().st_mtime, UTC)
    return build_uuid(f"{BASE}@{base.version}"), built.isoformat()


def _base_json(cfg: Config) -> dict[str, Any]:
    """The built-in template: always public, E2B's default template here."""
    build_id, built = base_build(cfg)
    size = (cfg.sandbox.vcpus, cfg.sandbox.memory_mb, cfg.sandbox.disk_size_mb)
    return _template(
        BASE, build_id, True, size, built, 1, max_vcpus(cfg.sandbox),
        isDefault=True, source=BASE_SOURCE,
    )  # fmt: skip


def built_template_json(
    build: SnapshotRecord, cfg: Config, public: bool, builds: int
) -> dict[str, Any]:
    """A template built from steps, by its newest build: its sandboxes are restored from a
    running guest, whose CPUs they keep."""
    size = (build.vcpus, build.memory_mb, cfg.sandbox.disk_size_mb)
    most = build.vcpus if build.memory else max_vcpus(cfg.sandbox)
    return _template(
        build.name, build.build_uuid, public, size, build.created_at, builds, most,
        source=f"steps on {build.template_id}",
    )  # fmt: skip


def _built(registry: SnapshotRegistry) -> list[tuple[SnapshotRecord, int]]:
    """The newest build of each template built from steps, and how many it has."""
    builds: dict[str, list[SnapshotRecord]] = {}
    for record in registry.list():  # oldest first
        builds.setdefault(record.name, []).append(record)
    return [(b[-1], len(b)) for b in builds.values() if b[-1].kind == TEMPLATE]


async def _all(
    catalog: TemplateCatalog, snapshots: SandboxSnapshots, cfg: Config
) -> list[dict[str, Any]]:
    records = await asyncio.to_thread(catalog.templates.list)
    built = await asyncio.to_thread(_built, snapshots.registry)
    public = await asyncio.to_thread(catalog.templates.public_names)
    return (
        [_base_json(cfg)]
        # `base` published for a cluster's nodes is a record too; it is listed once.
        + [template_json(r, cfg, r.template_id in public) for r in records if r.template_id != BASE]
        + [built_template_json(b, cfg, b.name in public, n) for b, n in built]
    )


@router.get("/v2/templates")
async def list_templates_v2(
    catalog: CatalogDep,
    snapshots: SnapshotsDep,
    cfg: ConfigDep,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
    nextToken: Annotated[str | None, Query(max_length=1024)] = None,
) -> list[dict[str, Any]]:
    """E2B's paged listing (`Template.list`), by template id; the next page's token in
    `x-next-token`. An id is the cursor, so a template deleted meanwhile moves no page."""
    templates = sorted(await _all(catalog, snapshots, cfg), key=lambda t: t["templateID"])
    if nextToken:
        after = decode_name_cursor(nextToken)
        templates = [t for t in templates if t["templateID"] > after]
    page = templates[:limit]
    if len(templates) > limit:
        response.headers["x-next-token"] = encode_name_cursor(page[-1]["templateID"])
    return page


@router.get("/templates")
async def list_templates(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep
) -> list[dict[str, Any]]:
    return await _all(catalog, snapshots, cfg)


async def built_builds(snapshots: SandboxSnapshots, name: str) -> list[SnapshotRecord]:
    """Every build of `name`, oldest first, when it is a template built from steps."""
    builds = await asyncio.to_thread(snapshots.registry.builds, name)
    return builds if builds and builds[-1].kind == TEMPLATE else []


async def require_template(
    catalog: TemplateCatalog, snapshots: SandboxSnapshots, name: str
) -> TemplateRecord | None:
    """E2B's 404 unless `name` is a template: `base`, one built from steps, or a pulled one
    (its record)."""
    if name == BASE or await built_builds(snapshots, name):
        return None
    return await asyncio.to_thread(catalog.templates.get, name)


@router.get("/templates/aliases/{alias}")
async def template_alias(
    catalog: CatalogDep, snapshots: SnapshotsDep, alias: str
) -> dict[str, Any]:
    await require_template(catalog, snapshots, alias)
    public = alias == BASE or alias in await asyncio.to_thread(catalog.templates.public_names)
    return {"templateID": alias, "public": public}


@router.get("/default-templates")
async def default_templates(cfg: ConfigDep) -> list[dict[str, Any]]:
    """E2B's platform templates: the built-in `base` here."""
    return [_base_json(cfg)]


@router.get("/templates/{template_id}")
async def get_template(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep, template_id: str
) -> dict[str, Any]:
    if template_id == BASE:
        return _base_json(cfg)
    public = template_id in await asyncio.to_thread(catalog.templates.public_names)
    if builds := await built_builds(snapshots, template_id):
        return built_template_json(builds[-1], cfg, public, len(builds))
    record = await asyncio.to_thread(catalog.templates.get, template_id)
    return template_json(record, cfg, public)


class TemplateUpdate(BaseModel):
    """E2B's `TemplateUpdateRequest`; without `public` it changes nothing."""

    model_config = ConfigDict(extra="forbid")

    public: bool | None = None


async def _update(
    catalog: TemplateCatalog,
    snapshots: SandboxSnapshots,
    template_id: str,
    body: TemplateUpdate | None,
) -> str:
    """Publish or unpublish a template (a tag in its name is ignored, as E2B does)."""
    name, _, _ = template_id.partition(":")
    await require_template(catalog, snapshots, name)
    public = None if body is None else body.public
    if public is not None and name == BASE:
        if not public:
            raise InvalidInput("the built-in 'base' template is always public")
    elif public is not None:
        await asyncio.to_thread(catalog.templates.set_public, name, public)
    return name


@router.patch("/v2/templates/{template_id}")
async def update_template_v2(
    catalog: CatalogDep,
    snapshots: SnapshotsDep,
    template_id: str,
    body: TemplateUpdate | None = None,
) -> dict[str, list[str]]:
    """`e2b template publish|unpublish`: E2B's `TemplateUpdateResponse`, its names."""
    return {"names": [await _update(catalog, snapshots, template_id, body)]}


@router.patch("/templates/{template_id}")
async def update_template(
    catalog: CatalogDep,
    snapshots: SnapshotsDep,
    template_id: str,
    body: TemplateUpdate | None = None,
) -> None:
    """Older CLIs: the same, answered with `null`, as E2B's v1."""
    await _update(catalog, snapshots, template_id, body)


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
    if not await asyncio.to_thread(snapshots.registry.builds, name):
        # Gone for good: a template made later under its name starts private.
        await asyncio.to_thread(catalog.templates.set_public, name, False)
    return Response(status_code=204)


@router.post("/templates/pull")
async def pull_template(
    puller: PullerDep, catalog: CatalogDep, cfg: ConfigDep, body: PullBody
) -> StreamingResponse:
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
            public = record.template_id in await asyncio.to_thread(catalog.templates.public_names)
            await queue.put({"template": template_json(record, cfg, public)})
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
