"""E2B's hosted secrets (`/secrets`, as the SDKs' `Secret` calls them): values go in,
never out (`credentials/vault.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict

from ..credentials.vault import SecretVault
from ..state.credentials import SecretRecord
from .deps import NodeDep
from .errors import ERROR_RESPONSES
from .pagination import decode_cursor, encode_cursor

router = APIRouter(responses=ERROR_RESPONSES, tags=["secrets"])


class NewSecret(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    value: str
    metadata: dict[str, str] | None = None


class SecretUpdate(BaseModel):
    """A new version's value; `metadata`, when given, replaces the secret's."""

    model_config = ConfigDict(extra="forbid")

    value: str
    metadata: dict[str, str] | None = None


class Secret(BaseModel):
    """A secret as every route shows it: never its value."""

    secretID: str
    name: str
    currentVersion: int
    metadata: dict[str, str]
    createdAt: datetime
    updatedAt: datetime


def _shown(record: SecretRecord) -> Secret:
    return Secret(
        secretID=record.secret_id,
        name=record.name,
        currentVersion=record.version,
        metadata=record.metadata,
        createdAt=record.created_at,
        updatedAt=record.updated_at,
    )


def _vault(node: NodeDep) -> SecretVault:
    return node.credentials.vault


@router.post("/secrets", status_code=201)
async def create_secret(node: NodeDep, body: NewSecret) -> Secret:
    """Names are stored lower-cased; 409 when one is taken."""
    return _shown(await _vault(node).create(body.name, body.value, body.metadata or {}))


@router.get("/secrets")
async def list_secrets(
    node: NodeDep,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
    nextToken: str | None = None,
) -> list[Secret]:
    """Oldest first; the next page's token in `x-next-token`."""
    after = decode_cursor(nextToken) if nextToken else None
    page = await _vault(node).page(limit + 1, after)
    if len(page) > limit:
        page = page[:limit]
        response.headers["x-next-token"] = encode_cursor(page[-1].created_at, page[-1].secret_id)
    return [_shown(record) for record in page]


# `path`: a name may hold a '/', which the SDK puts into the path as it is.
@router.get("/secrets/{secret:path}")
async def get_secret(node: NodeDep, secret: str) -> Secret:
    """By id or name."""
    return _shown(await _vault(node).get(secret))


@router.post("/secrets/{secret:path}")
async def update_secret(node: NodeDep, secret: str, body: SecretUpdate) -> Secret:
    """Stores the value as the next version."""
    return _shown(await _vault(node).update(secret, body.value, body.metadata))


@router.delete("/secrets/{secret:path}", status_code=204)
async def delete_secret(node: NodeDep, secret: str) -> Response:
    """Its placeholders stop resolving at once."""
    await _vault(node).delete(secret)
    return Response(status_code=204)
