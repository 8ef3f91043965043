"""E2B's template tags: `Template.assign_tags`, `remove_tags` and `get_tags`, and the
tag counts, groups and assignment histories E2B's dashboard API lists.

A tag names one build of a template built here from steps (`images/snapshots.py`);
`name:tag` then starts sandboxes from that build, and `name` from the one tagged
`default`. A pulled template and `base` have one build, tagged `default`.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any, Literal, get_args

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from ..config import Config
from ..errors import InvalidInput, NotFound
from ..images.catalog import TemplateCatalog
from ..images.snapshots import DEFAULT_TAG, TEMPLATE, split_ref, validate_tags
from ..images.templates import build_uuid, valid_name
from ..runtime.snapshots.named import SandboxSnapshots
from .deps import CatalogDep, ConfigDep, SnapshotsDep
from .errors import ERROR_RESPONSES
from .pagination import decode_cursor, encode_cursor
from .templates import base_build, built_builds, require_template

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


# A tag given to a build: (the build's UUID, when it was given, when the build was made).
Assignment = tuple[str, str, str]


async def template_assignments(
    catalog: TemplateCatalog, snapshots: SandboxSnapshots, cfg: Config, template_id: str
) -> dict[str, list[Assignment]]:
    """Each tag of the template `template_id` names, with its assignments to builds that
    exist, newest first. A pulled template and `base` have one build, tagged `default`."""
    name, _ = split_ref(template_id)
    if await built_builds(snapshots, name):
        found = await asyncio.to_thread(snapshots.registry.assignments, name)
        return {
            tag: [(build.build_uuid, when, build.created_at) for build, when in ready]
            for tag, ready in found.items()
        }
    record = await require_template(catalog, snapshots, name)
    if record is not None:
        return {DEFAULT_TAG: [(record.build_uuid, record.created_at, record.created_at)]}
    build_id, built = base_build(cfg)
    return {DEFAULT_TAG: [(build_id, built, built)]} if built else {}


def _assignment_json(tag: str, assignment: Assignment) -> dict[str, Any]:
    build_id, when, built = assignment
    return {
        # Derived from what it records, so it stays the same across calls and nodes.
        "assignmentId": build_uuid(f"{tag}@{build_id}@{when}"),
        "buildId": build_id,
        "assignedAt": when,
        "buildCreatedAt": built,
        # A build is recorded once it is done.
        "buildFinishedAt": built,
    }


@router.get("/templates/{template_id}/tags")
async def list_tags(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep, template_id: str
) -> list[dict[str, Any]]:
    """`Template.get_tags`: each tag and the build it names now, oldest given first."""
    tags = await template_assignments(catalog, snapshots, cfg, template_id)
    current = sorted(((a[0][1], tag, a[0][0]) for tag, a in tags.items()), key=lambda t: t[:2])
    return [{"tag": tag, "buildID": build, "createdAt": when} for when, tag, build in current]


@router.get("/templates/{template_id}/tags/count")
async def count_tags(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep, template_id: str
) -> dict[str, int]:
    """E2B's `TemplateTagsCountResponse`: the tags that name a build."""
    return {"total": len(await template_assignments(catalog, snapshots, cfg, template_id))}


@router.get("/templates/{template_id}/tags/exists")
async def tag_exists(
    catalog: CatalogDep, snapshots: SnapshotsDep, cfg: ConfigDep, template_id: str, tag: str
) -> dict[str, Any]:
    """E2B's `TemplateTagExistsResponse`, for the tag as E2B normalizes it."""
    normalized = validate_tags([tag])[0]
    tags = await template_assignments(catalog, snapshots, cfg, template_id)
    return {"exists": normalized in tags, "normalizedTag": normalized}


Sort = Literal["latest_desc", "latest_asc", "name_asc", "name_desc"]
_SEARCH = re.compile(r"[a-z0-9._-]{0,64}")


@router.get("/templates/{template_id}/tags/groups")
async def tag_groups(
    catalog: CatalogDep,
    snapshots: SnapshotsDep,
    cfg: ConfigDep,
    template_id: str,
    assignmentLimit: int = 6,
    tagsLimit: int = 25,
    tagsCursor: str | None = None,
    search: str | None = None,
    sort: Sort = "latest_desc",
) -> dict[str, Any]:
    """E2B's `TemplateTagGroupsResponse`: tags (whose name holds `search`) with their newest
    assignments, a page of tags at a time; limits are clamped as E2B clamps them."""
    needle = (search or "").strip().lower()
    if not _SEARCH.fullmatch(needle):
        raise InvalidInput("Invalid search parameter")
    per_tag, page_size = min(max(assignmentLimit, 1), 25), min(max(tagsLimit, 1), 100)
    tags = await template_assignments(catalog, snapshots, cfg, template_id)
    descending = sort.endswith("desc")

    def key(tag: str, latest: str) -> tuple[Any, ...]:
        return (tag,) if sort.startswith("name") else (datetime.fromisoformat(latest), tag)

    order = sorted(
        ((key(tag, a[0][1]), tag, a) for tag, a in tags.items() if needle in tag),
        key=lambda item: item[0],
        reverse=descending,
    )
    if tagsCursor:
        after = key(*_groups_cursor(tagsCursor, sort))
        order = [item for item in order if (item[0] < after if descending else item[0] > after)]
    page = order[:page_size]
    next_cursor = None
    if len(order) > page_size:
        _, last_tag, last_assigned = page[-1]
        next_cursor = f"{sort}|{last_assigned[0][1]}|{last_tag}"  # E2B's: sort|latest|tag
    return {
        "tags": [
            {
                "tag": tag,
                "assignments": [_assignment_json(tag, a) for a in assigned[:per_tag]],
                "hasMore": len(assigned) > per_tag,
            }
            for _, tag, assigned in page
        ],
        "nextCursor": next_cursor,
    }


def _groups_cursor(cursor: str, sort: str) -> tuple[str, str]:
    """(tag, its latest assignment) after which a page of tag groups goes on."""
    given, _, rest = cursor.partition("|")
    latest, _, tag = rest.partition("|")
    if given in get_args(Sort) and given != sort:
        raise InvalidInput("Cursor was issued for a different sort; clear the cursor and restart")
    try:
        aware = datetime.fromisoformat(latest).tzinfo is not None
    except ValueError:
        aware = False
    if given != sort or not tag or not aware:
        raise InvalidInput("Invalid cursor")
    return tag, latest


@router.get("/templates/{template_id}/tags/{tag}/assignments")
async def tag_assignments(
    catalog: CatalogDep,
    snapshots: SnapshotsDep,
    cfg: ConfigDep,
    template_id: str,
    tag: str,
    cursor: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """E2B's `TemplateTagAssignmentsResponse`: one tag's assignments, newest first."""
    normalized = validate_tags([tag])[0]
    tags = await template_assignments(catalog, snapshots, cfg, template_id)
    assigned = [_assignment_json(normalized, a) for a in tags.get(normalized, [])]
    assigned.sort(key=_when_and_id, reverse=True)
    if cursor:
        after = decode_cursor(cursor)
        assigned = [a for a in assigned if _when_and_id(a) < after]
    page = assigned[: min(max(limit, 1), 100)]
    more = len(assigned) > len(page)
    return {
        "data": page,
        "nextCursor": encode_cursor(*_when_and_id(page[-1])) if more else None,
    }


def _when_and_id(assignment: dict[str, Any]) -> tuple[datetime, str]:
    return datetime.fromisoformat(assignment["assignedAt"]), assignment["assignmentId"]
