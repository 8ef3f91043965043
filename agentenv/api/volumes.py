"""E2B's volumes: the API (`/volumes`, API key) and the content API (`/volumecontent`,
the volume's bearer token), as the SDKs' `Volume` calls them."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from ..volumes.content import VolumeFiles
from ..volumes.registry import VolumeRecord
from .deps import ConfigDep, NodeDep
from .errors import ERROR_RESPONSES
from .models import NewVolume, PathUpdate, Volume, VolumeAndToken, VolumeEntry

router = APIRouter(responses=ERROR_RESPONSES)
content = APIRouter(responses=ERROR_RESPONSES)
CONTENT = "/volumecontent/"


def _with_token(record: VolumeRecord) -> VolumeAndToken:
    return VolumeAndToken(volumeID=record.volume_id, name=record.name, token=record.token)


@router.post("/volumes", status_code=201)
async def create_volume(node: NodeDep, body: NewVolume) -> VolumeAndToken:
    return _with_token(await node.volumes.create(body.name))


@router.get("/volumes")
async def list_volumes(node: NodeDep) -> list[Volume]:
    records = await node.volumes.registry.list()
    return [Volume(volumeID=r.volume_id, name=r.name) for r in records]


@router.get("/volumes/{volume_id}")
async def get_volume(node: NodeDep, volume_id: str) -> VolumeAndToken:
    return _with_token(await node.volumes.registry.get(volume_id))


@router.delete("/volumes/{volume_id}", status_code=204)
async def delete_volume(node: NodeDep, volume_id: str) -> Response:
    await node.volumes.delete(volume_id)
    return Response(status_code=204)


async def _files(
    node: NodeDep, volume_id: str, authorization: Annotated[str, Header()] = ""
) -> VolumeFiles:
    return await node.volumes.open(volume_id, authorization)


Files = Annotated[VolumeFiles, Depends(_files)]
Mode = Annotated[int | None, Query(ge=0, le=0o7777)]
Id = Annotated[int | None, Query(ge=0, le=2**32 - 2)]


@content.get(CONTENT + "{volume_id}/path")
async def stat_path(files: Files, path: str) -> VolumeEntry:
    return VolumeEntry(**await asyncio.to_thread(files.stat, path))


@content.patch(CONTENT + "{volume_id}/path")
async def update_path(files: Files, path: str, body: PathUpdate) -> VolumeEntry:
    return VolumeEntry(**await asyncio.to_thread(files.update, path, body.uid, body.gid, body.mode))


@content.delete(CONTENT + "{volume_id}/path", status_code=204)
async def remove_path(files: Files, path: str) -> Response:
    await asyncio.to_thread(files.remove, path)
    return Response(status_code=204)


@content.get(CONTENT + "{volume_id}/dir")
async def list_dir(
    files: Files, path: str, depth: Annotated[int, Query(ge=1, le=64)] = 1
) -> list[VolumeEntry]:
    return [VolumeEntry(**e) for e in await asyncio.to_thread(files.list_dir, path, depth)]


@content.post(CONTENT + "{volume_id}/dir", status_code=201)
async def make_dir(
    files: Files, path: str, uid: Id = None, gid: Id = None, mode: Mode = None, force: bool = False
) -> VolumeEntry:
    return VolumeEntry(**await asyncio.to_thread(files.make_dir, path, uid, gid, mode, force))


@content.get(CONTENT + "{volume_id}/file")
async def read_file(files: Files, path: str) -> StreamingResponse:
    chunks = await asyncio.to_thread(files.read_file, path)
    return StreamingResponse(chunks, media_type="application/octet-stream")


@content.put(CONTENT + "{volume_id}/file", status_code=201)
async def write_file(
    files: Files,
    cfg: ConfigDep,
    request: Request,
    path: str,
    uid: Id = None,
    gid: Id = None,
    mode: Mode = None,
    force: bool = False,
) -> VolumeEntry:
    limit = cfg.server.max_volume_file_bytes
    written = await files.write_file(path, request.stream(), limit, uid, gid, mode, force)
    return VolumeEntry(**written)
