"""Template routes the E2B CLI and SDK call, through the SDK's own generated client: the
listing's `Template`s, publishing, the default templates, tag counts, groups and
assignment histories, and the key's team. No VM: templates are records in a real store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b.api.client.api.tags import (
    get_templates_template_id_tags,
    get_templates_template_id_tags_count,
    get_templates_template_id_tags_exists,
    get_templates_template_id_tags_groups,
    get_templates_template_id_tags_tag_assignments,
)
from e2b.api.client.api.templates import (
    get_default_templates,
    get_templates,
    get_v2_templates,
    patch_templates_template_id,
    patch_v_2_templates_template_id,
)
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import (
    GetTemplatesTemplateIDTagsGroupsSort,
    TemplateUpdateRequest,
    TemplateUpdateResponse,
)
from fastapi import APIRouter, Depends, FastAPI

from agentenv.api import templates, templatetags
from agentenv.api.auth import ApiKeyAuth
from agentenv.api.errors import install_error_handlers
from agentenv.api.teams import team_id, teams_router
from agentenv.config import Config
from agentenv.images.base import base_dir, base_version
from agentenv.images.catalog import TemplateCatalog
from agentenv.images.snapshots import TEMPLATE, SnapshotRecord, SnapshotRegistry
from agentenv.images.templates import TemplateRecord, TemplateRegistry
from agentenv.storage.posix import PosixObjectStore

KEY = "e2b_" + "0" * 40
PULLED = TemplateRecord("app", "localhost:5000/team/app:v1", "sha256:1", ["l1"], 2**30)


class Snapshots:
    """What the template routes use of a node's snapshots: the registry and deletes."""

    def __init__(self, registry: SnapshotRegistry) -> None:
        self.registry = registry

    async def delete(self, ref: str) -> None:
        self.registry.delete(ref)


class Node:
    def __init__(self, catalog: TemplateCatalog, snapshots: Snapshots) -> None:
        self.catalog = catalog
        self.snapshots = snapshots


def _build(tag: str, created_at: str) -> SnapshotRecord:
    return SnapshotRecord(
        "tpl", tag, "i1", "base", True, 2, 512, "k1", created_at=created_at, kind=TEMPLATE
    )


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[AuthenticatedClient]:
    cfg = Config()
    cfg.paths.home = str(tmp_path / "home")
    base = base_dir(cfg)
    base.mkdir(parents=True)
    (base / "rootfs.ext4").write_bytes(b"")
    (base / "manifest.json").write_text(json.dumps({"version": base_version(cfg)}))
    store = PosixObjectStore(tmp_path / "objects")
    registry = SnapshotRegistry(store)
    first, second = (
        _build("b1", "2026-01-01T00:00:00+00:00"),
        _build("b2", "2026-01-02T00:00:00+00:00"),
    )
    for build in (first, second):
        registry.save(build)
    registry.tag(first, ["v1"])
    registry.tag(second, ["default", "v1"])  # v1 moves: two assignments
    blockd: Any = None  # no route here opens a disk
    catalog = TemplateCatalog(cfg, TemplateRegistry(store), blockd)
    catalog.templates.save(PULLED)

    app = FastAPI()
    install_error_handlers(app)
    protected = APIRouter(dependencies=[Depends(ApiKeyAuth(KEY))])
    protected.include_router(templatetags.router)
    protected.include_router(templates.router)
    protected.include_router(teams_router(KEY))
    app.include_router(protected)
    app.state.node = Node(catalog, Snapshots(registry))
    app.state.config = cfg
    transport = httpx.ASGITransport(app=app)
    async with AuthenticatedClient(
        base_url="http://aenv",
        token=KEY,
        prefix="",
        auth_header_name="X-API-Key",
        httpx_args={"transport": transport},
        raise_on_unexpected_status=True,
    ) as client:
        yield client


async def test_the_v2_listing_pages_by_template_id(api: AuthenticatedClient) -> None:
    """`Template.list(limit=…)` of E2B's newest SDK: pages in `x-next-token`, none after
    the last; a token that is not ours is a clear 400."""
    seen: list[str] = []
    token: str | None = None
    while True:
        answer = await get_v2_templates.asyncio_detailed(
            client=api, limit=2, **({"next_token": token} if token else {})
        )
        assert answer.status_code == 200 and isinstance(answer.parsed, list)
        seen += [t.template_id for t in answer.parsed]
        token = answer.headers.get("x-next-token")
        if not token:
            break
    assert seen == ["app", "base", "tpl"]
    http = api.get_async_httpx_client()
    bad = await http.get("/v2/templates", params={"nextToken": "%%%"})
    assert bad.status_code == 400 and "nextToken" in bad.json()["message"]
    too_many = await http.get("/v2/templates", params={"limit": 101})
    assert too_many.status_code == 400


async def test_listed_templates_are_the_sdks_and_publishing_is_kept(
    api: AuthenticatedClient,
) -> None:
    listed = {t.template_id: t for t in await get_templates.asyncio(client=api) or []}
    assert set(listed) == {"base", "app", "tpl"}
    assert (listed["base"].public, listed["app"].public, listed["tpl"].public) == (
        True,
        False,
        False,
    )
    assert listed["tpl"].build_count == 2 and listed["app"].build_id == PULLED.build_uuid
    defaults = await get_default_templates.asyncio(client=api) or []
    assert [(t.template_id, t.is_default) for t in defaults] == [("base", True)]

    body = TemplateUpdateRequest(public=True)
    published = await patch_v_2_templates_template_id.asyncio(
        template_id="tpl:v1", client=api, body=body
    )
    assert isinstance(published, TemplateUpdateResponse) and published.names == ["tpl"]
    await patch_templates_template_id.asyncio(template_id="app", client=api, body=body)
    listed = {t.template_id: t for t in await get_templates.asyncio(client=api) or []}
    assert listed["tpl"].public and listed["app"].public
    unpublish = TemplateUpdateRequest(public=False)
    answer = await patch_v_2_templates_template_id.asyncio_detailed(
        template_id="app", client=api, body=unpublish
    )
    assert answer.status_code == 200
    assert not {t.template_id: t for t in await get_templates.asyncio(client=api) or []}[
        "app"
    ].public

    base = await patch_v_2_templates_template_id.asyncio_detailed(
        template_id="base", client=api, body=unpublish
    )
    assert base.status_code == 400
    http = api.get_async_httpx_client()
    missing = await http.patch("/v2/templates/gone", json={"public": True})
    assert (missing.status_code, missing.json()["message"]) == (404, "template 'gone' not found")
    unknown = await http.patch("/v2/templates/tpl", json={"public": True, "owner": "x"})
    assert unknown.status_code == 400


async def test_tags_count_exist_group_and_keep_their_assignments(
    api: AuthenticatedClient,
) -> None:
    count = await get_templates_template_id_tags_count.asyncio(template_id="tpl", client=api)
    assert count is not None and count.total == 2
    exists = await get_templates_template_id_tags_exists.asyncio(
        template_id="tpl", client=api, tag=" V1"
    )
    assert exists is not None and (exists.exists, exists.normalized_tag) == (True, "v1")
    nope = await get_templates_template_id_tags_exists.asyncio(
        template_id="tpl", client=api, tag="v9"
    )
    assert nope is not None and not nope.exists
    bad = await get_templates_template_id_tags_exists.asyncio_detailed(
        template_id="tpl", client=api, tag="no spaces"
    )
    assert bad.status_code == 400

    by_name = GetTemplatesTemplateIDTagsGroupsSort.NAME_ASC
    first = await get_templates_template_id_tags_groups.asyncio(
        template_id="tpl", client=api, tags_limit=1, assignment_limit=1, sort=by_name
    )
    assert first is not None and [g.tag for g in first.tags] == ["default"]
    assert isinstance(first.next_cursor, str)
    rest = await get_templates_template_id_tags_groups.asyncio(
        template_id="tpl", client=api, tags_limit=1, assignment_limit=1, sort=by_name,
        tags_cursor=first.next_cursor,
    )  # fmt: skip
    assert rest is not None and [g.tag for g in rest.tags] == ["v1"] and rest.next_cursor is None
    assert rest.tags[0].has_more and len(rest.tags[0].assignments) == 1
    other_sort = await get_templates_template_id_tags_groups.asyncio_detailed(
        template_id="tpl", client=api, tags_cursor=first.next_cursor
    )
    assert other_sort.status_code == 400
    searched = await get_templates_template_id_tags_groups.asyncio(
        template_id="tpl", client=api, search="V"
    )
    assert searched is not None and [g.tag for g in searched.tags] == ["v1"]

    page = await get_templates_template_id_tags_tag_assignments.asyncio(
        template_id="tpl", tag="v1", client=api, limit=1
    )
    assert page is not None and isinstance(page.next_cursor, str)
    older = await get_templates_template_id_tags_tag_assignments.asyncio(
        template_id="tpl", tag="v1", client=api, cursor=page.next_cursor
    )
    assert older is not None and older.next_cursor is None
    # Newest first: v1 was given to b1, then moved to b2.
    builds = [str(a.build_id) for a in page.data + older.data]
    assert builds == [_build("b2", "").build_uuid, _build("b1", "").build_uuid]
    assert page.data[0].assigned_at > older.data[0].assigned_at

    # A pulled template has one build, tagged `default`; an unknown name is E2B's 404.
    tags = await get_templates_template_id_tags.asyncio(template_id="app", client=api)
    assert [(t.tag, str(t.build_id)) for t in tags or []] == [("default", PULLED.build_uuid)]
    gone = await get_templates_template_id_tags_count.asyncio_detailed(
        template_id="gone", client=api
    )
    assert gone.status_code == 404


async def test_the_keys_team_is_the_only_one(api: AuthenticatedClient) -> None:
    answer = await api.get_async_httpx_client().get("/teams")
    assert answer.json() == [
        {"teamID": team_id(KEY), "name": "default", "apiKey": KEY, "isDefault": True}
    ]
    assert team_id(KEY) != team_id(KEY + "1")
