"""E2B's template build API (`Template.build` in the SDKs).

The flow: `POST /v3/templates` registers a build; for each COPY step the SDK asks
`GET /templates/{id}/files/{hash}` whether the server has its files and, if not, uploads
them to the signed URL it gets; `POST /v2/templates/{id}/builds/{build}` starts the build
and the client polls `GET /templates/{id}/builds/{build}/status`. A build from an image
alone is a pull, one from a template alone a copy; anything with steps, a start or ready
command, or `base` as parent runs in a build sandbox (`images/stepbuild.py`).
"""

from __future__ import annotations

import asyncio
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ..errors import AenvError, Conflict, Forbidden, InvalidInput, TooLarge
from ..images.builds import LogLevel
from ..images.buildsteps import Step, is_files_hash, parse_steps
from ..images.catalog import BASE, E2B_BASE_IMAGES
from ..images.reference import parse_reference
from ..images.snapshots import DEFAULT_TAG, validate_tags
from ..images.stepbuild import Recipe
from ..images.templates import validate_name
from .deps import BuildsDep, CatalogDep, ConfigDep
from .errors import ERROR_RESPONSES
from .logpages import Direction, log_page
from .models import MAX_VCPUS

router = APIRouter(responses=ERROR_RESPONSES)

# Bounds on what a template may ask for (admission still checks the host has it).
MAX_MEMORY_MB = 65536
# E2B's minFreeDiskMb: free space the root filesystem grows to after the steps (MiB); a
# sandbox disk has 64 GiB of virtual size to grow into.
MAX_FREE_DISK_MB = 32768


class TemplateBuildRequest(BaseModel):
    """`TemplateBuildRequestV3`; `alias` is what SDKs before `name` existed sent."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, max_length=128)
    alias: str | None = Field(default=None, max_length=128)
    tags: list[str] | None = None
    # One team per server: accepted so older SDKs work, and meaningless here.
    teamID: str | None = None
    cpuCount: int | None = Field(default=None, ge=1, le=MAX_VCPUS)
    # E2B's resizable templates (SDK 2.64+); here only the template's own cpuCount.
    maxCpuCount: int | None = Field(default=None, ge=1, le=MAX_VCPUS)
    memoryMB: int | None = Field(default=None, ge=128, le=MAX_MEMORY_MB)
    minFreeDiskMb: int | None = Field(default=None, ge=0, le=MAX_FREE_DISK_MB)


class GeneralRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["registry"]
    username: str
    password: str


class AwsRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["aws"]
    awsAccessKeyId: str
    awsSecretAccessKey: str
    awsRegion: str


class GcpRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["gcp"]
    serviceAccountJson: str


class BuildStart(BaseModel):
    """`TemplateBuildStartV2`."""

    model_config = ConfigDict(extra="forbid")

    fromImage: str | None = Field(default=None, max_length=512)
    fromTemplate: str | None = Field(default=None, max_length=128)
    fromImageRegistry: (
        Annotated[GeneralRegistry | AwsRegistry | GcpRegistry, Field(discriminator="type")] | None
    ) = None
    force: bool | None = None
    steps: list[dict[str, Any]] = Field(default_factory=list)
    startCmd: str | None = None
    readyCmd: str | None = None


def _template_name(body: TemplateBuildRequest) -> tuple[str, list[str]]:
    """The template's name and the tags its build gets (`name:tag` and `tags`, as E2B:
    `default` when none is given)."""
    if body.name and body.alias and body.name != body.alias:
        raise InvalidInput(f"name {body.name!r} and alias {body.alias!r} differ; send one")
    ref = body.name or body.alias
    if not ref:
        raise InvalidInput("name: a template name is required")
    name, _, tag = ref.partition(":")
    if name == BASE:
        raise Conflict("'base' is the built-in template and cannot be rebuilt")
    tags = [tag] if tag else []
    tags += body.tags or []
    return validate_name(name), validate_tags(tags) or [DEFAULT_TAG]


def _fixed_size(body: TemplateBuildRequest) -> None:
    """A built template is a snapshot of a running guest, whose CPUs its sandboxes keep:
    `maxCpuCount` may only repeat `cpuCount` (`docs/e2b-compatibility.md`)."""
    most = body.maxCpuCount
    if most is None or most == body.cpuCount:
        return
    if body.cpuCount is not None and most < body.cpuCount:
        raise InvalidInput(f"maxCpuCount ({most}) must be at least cpuCount ({body.cpuCount})")
    raise InvalidInput(
        "maxCpuCount: resizable templates are not supported here; a template's sandboxes "
        "start from a snapshot of a running guest and keep its cpuCount (send cpuCount "
        f"{most} and no maxCpuCount for a template of {most} CPUs)"
    )


@router.post("/v3/templates", status_code=202)
async def request_build(builds: BuildsDep, body: TemplateBuildRequest) -> dict[str, Any]:
    """Register a build of a template; it starts when the client sends the recipe."""
    name, tags = _template_name(body)
    _fixed_size(body)
    running = [b for b in builds.tracker.of_template(name) if b.status == "building"]
    if running:
        raise Conflict(f"template '{name}' is being built (build {running[-1].build_id})")
    build = builds.register(name, body.cpuCount, body.memoryMB)
    build.tags = tags
    # 0 asks for no growth, as in E2B.
    build.min_free_disk_mb = body.minFreeDiskMb or None
    return {
        "templateID": name,
        "buildID": build.build_id,
        "public": False,
        "names": [name],
        "tags": tags,
        "aliases": [name],
    }


class FileUpload(BaseModel):
    """`TemplateBuildFileUpload`: whether the server has a COPY step's files, and where
    to upload them if not."""

    present: bool
    url: str | None = None


@router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
async def file_upload_link(
    builds: BuildsDep, catalog: CatalogDep, request: Request, template_id: str, files_hash: str
) -> FileUpload:
    """The upload URL for a COPY step's archive, signed for an hour."""
    if not is_files_hash(files_hash):
        raise InvalidInput(f"files hash {files_hash!r}: hex digits are required")
    if not builds.tracker.of_template(template_id):
        await asyncio.to_thread(catalog.templates.get, template_id)
    present = await asyncio.to_thread(builds.files.present, files_hash)
    url = f"{public_base(request)}{UPLOADS}{files_hash.lower()}?"
    url += builds.files.upload_query(files_hash)
    return FileUpload(present=present, url=url)


def public_base(request: Request) -> str:
    """The address the client used: a cluster's control plane names itself in
    `X-Forwarded-Host` and `X-Forwarded-Proto` when it relays."""
    host = request.headers.get("x-forwarded-host")
    if not host:
        return str(request.base_url).rstrip("/")
    return f"{request.headers.get('x-forwarded-proto', 'http')}://{host}"


UPLOADS = "/build-files/"
uploads = APIRouter(responses=ERROR_RESPONSES)


@uploads.put(UPLOADS + "{files_hash}")
async def upload_files(
    builds: BuildsDep, cfg: ConfigDep, request: Request, files_hash: str
) -> Response:
    """A COPY step's archive, streamed to the object store; the URL's signature is the
    credential."""
    query = request.query_params
    if not builds.files.signed(files_hash, query.get("expires", ""), query.get("signature", "")):
        raise Forbidden("the upload URL's signature is missing, wrong or expired")
    limit = cfg.server.max_build_file_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise TooLarge(f"a build's files may have at most {limit} bytes")
    with tempfile.NamedTemporaryFile(dir=cfg.home, prefix=".upload-") as spool:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"a build's files may have at most {limit} bytes")
            await asyncio.to_thread(spool.write, chunk)
        await asyncio.to_thread(spool.flush)
        await asyncio.to_thread(builds.files.put, files_hash, Path(spool.name))
    return Response(status_code=200)


def _refusal(body: BuildStart) -> str | None:
    """Why this recipe cannot be built here, naming the field; None if it can."""
    if (body.fromImage is None) == (body.fromTemplate is None):
        return "send exactly one of fromImage and fromTemplate"
    if body.fromTemplate is not None and body.fromImageRegistry is not None:
        return "fromImageRegistry: only applies to fromImage"
    if isinstance(body.fromImageRegistry, AwsRegistry):
        return "fromImageRegistry: type 'aws' (ECR) is not supported yet; use type 'registry'"
    return None


def _credentials(body: BuildStart) -> tuple[str, str] | None:
    registry = body.fromImageRegistry
    if isinstance(registry, GeneralRegistry):
        return registry.username, registry.password
    if isinstance(registry, GcpRegistry):
        # Google's registries take a service account key as Basic auth under this user.
        return "_json_key", registry.serviceAccountJson
    return None


@router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
async def start_build(
    builds: BuildsDep, catalog: CatalogDep, template_id: str, build_id: str, body: BuildStart
) -> Response:
    """Start a registered build in the background; 202 at once, progress in its status."""
    build = builds.tracker.get(template_id, build_id)
    if build.status != "waiting":
        raise Conflict(f"build '{build_id}' was already started ({build.status})")
    refusal = _refusal(body)
    image = body.fromImage
    parent = body.fromTemplate
    if image in E2B_BASE_IMAGES:
        image, parent = None, BASE
    steps: list[Step] = []
    try:
        steps = parse_steps(body.steps)
    except AenvError as exc:
        refusal = refusal or exc.message
    if refusal is None and image is not None:
        try:
            parse_reference(image)
        except AenvError as exc:
            refusal = f"fromImage: {exc.message}"
    if refusal is not None:
        build.fail(refusal)
        raise InvalidInput(refusal)
    # Tagged builds are kept side by side, as builds from steps are (a pull has one).
    tagged = build.tags != [DEFAULT_TAG]
    # Free disk space is made in a build sandbox: the filesystem grows there.
    grown = build.min_free_disk_mb is not None
    stepped = steps or body.startCmd or body.readyCmd or parent == BASE or tagged or grown
    if not stepped and parent is not None:
        # A template made from steps is a snapshot: one built from it runs in a sandbox.
        stepped = await asyncio.to_thread(catalog.templates.find, parent) is None
    if stepped:
        recipe = Recipe(
            parent or "",
            steps,
            body.startCmd,
            body.readyCmd,
            force=bool(body.force),
            min_free_disk_mb=build.min_free_disk_mb,
        )
        builds.from_steps(build, recipe, image, _credentials(body))
    elif image is not None:
        builds.from_image(build, image, _credentials(body))
    else:
        builds.from_template(build, parent or "")
    return Response(status_code=202)


@router.get("/templates/{template_id}/builds/{build_id}/status")
async def build_status(
    builds: BuildsDep,
    template_id: str,
    build_id: str,
    logsOffset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=100)] = 100,
    level: LogLevel | None = None,
) -> dict[str, Any]:
    """`TemplateBuildInfo`: status, a page of log entries, and why a failed build failed."""
    build = builds.tracker.get(template_id, build_id)
    # Read the status first: a build that is finished here has all of its lines logged.
    status = build.status
    page = build.logs(level)[logsOffset : logsOffset + limit]
    entries = [{"timestamp": e.timestamp, "level": e.level, "message": e.message} for e in page]
    info: dict[str, Any] = {
        "templateID": build.template_id,
        "buildID": build.build_id,
        "status": status,
        "logEntries": entries,
        "logs": [f"[{e.timestamp}] {e.message}" for e in page],
    }
    if status == "error":
        info["reason"] = {"message": build.reason or "build failed"}
        if build.failed_step is not None:
            info["reason"]["step"] = build.failed_step
    return info


@router.get("/templates/{template_id}/builds/{build_id}/logs")
async def build_logs(
    builds: BuildsDep,
    template_id: str,
    build_id: str,
    cursor: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=100)] = 100,
    direction: Direction = "forward",
    level: LogLevel | None = None,
    source: Literal["temporary", "persistent"] | None = None,
) -> dict[str, Any]:
    """`TemplateBuildLogsResponse`: log lines from `cursor` (ms since the epoch) on, or
    back from it, newest first. Builds are kept in memory: `source` changes nothing."""
    lines = builds.tracker.get(template_id, build_id).logs(level)
    chosen = log_page(lines, lambda line: _epoch_ms(line.timestamp), cursor, direction, limit)
    return {
        "logs": [
            {"timestamp": line.timestamp, "level": line.level, "message": line.message}
            for line in chosen
        ]
    }


def _epoch_ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
