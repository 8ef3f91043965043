"""E2B's template tags: `Template.assign_tags`, `remove_tags` and `get_tags`.

A tag names one build of a template built here from steps (`images/snapshots.py`);
`name:tag` then starts sandboxes from that build, and `name` from the one tagged
`default`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidInput, NotFound
from ..images.snapshots import DEFAULT_TAG, TEMPLATE, split_ref, validate_tags
from ..images.templates import valid_name
from .deps import SnapshotsDep
from .errors import ERROR_RESPONSES

router = APIRouter(responses=ERROR_RESPONSES)


class AssignTags(BaseModel):
    """`AssignTemplateTagsRequest`: the build `target` (`name[:tag]`) gets `tags`."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(max_length=256)
    tags: list[str] = Field(min_length=1, max_length=64)


class DeleteTags(BaseModel):
    """`DeleteTemplateTagsRequest`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=128)
    tags: list[str] = Field(min_length=1, max_length=64)


def _name(ref: str) -> tuple[str, str]:
    name, _, tag = ref.partition(":")
    if not valid_name(name) or (":" in ref and not tag):
        raise InvalidInput(f"{ref!r}: a template name, optionally with ':tag', is required")
    return name, tag or DEFAULT_TAG


@router.post("/templates/tags", status_code=201)
async def assign_tags(snapshots: SnapshotsDep, body: AssignTags) -> dict[str, Any]:
    _name(body.target)  # the shape of the reference, before any lookup
    tags = validate_tags(body.tags)
    registry = snapshots.registry
    build = await asyncio.to_thread(registry.find, body.target)
    if build is None or build.kind != TEMPLATE:
        raise NotFound(f"template build {body.target!r} not found")
    await asyncio.to_thread(registry.tag, build, tags)
    return {"tags": tags, "buildID": build.build_uuid}


@router.delete("/templates/tags", status_code=204)
async def delete_tags(snapshots: SnapshotsDep, body: DeleteTags) -> Response:
    if ":" in body.name:
        raise InvalidInput(f"name {body.name!r}: a template name without a tag is required")
    name, _ = _name(body.name)
    tags = validate_tags(body.tags)
    if DEFAULT_TAG in tags:
        raise InvalidInput("the 'default' tag cannot be removed; assign it to another build")
    given = {tag for tag, _, _ in await asyncio.to_thread(snapshots.registry.tags, name)}
    if missing := [tag for tag in tags if tag not in given]:
        raise NotFound(f"template {name!r} has no tag {', '.join(missing)}")
    await asyncio.to_thread(snapshots.registry.untag, name, tags)
    return Response(status_code=204)


@router.get("/templates/{template_id}/tags")
async def list_tags(snapshots: SnapshotsDep, template_id: str) -> list[dict[str, Any]]:
    name, _ = split_ref(template_id)
    tags = await asyncio.to_thread(snapshots.registry.tags, name)
    if not tags:
        builds = await asyncio.to_thread(snapshots.registry.builds, name)
        if not builds or builds[-1].kind != TEMPLATE:
            raise NotFound(f"template {name!r} not found")
    return [
        {"tag": tag, "buildID": build.build_uuid, "createdAt": when} for tag, build, when in tags
    ]
