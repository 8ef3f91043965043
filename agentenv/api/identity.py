"""Workload identity over HTTP: what verifiers fetch (OIDC discovery, the JWKS; no API
key), and the operator's view and rotation of the signing keys (native routes)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ..credentials.identity import DISCOVERY_PATH, JWKS_PATH, KeyState, PublicKeys, key_state
from ..state.credentials import SigningKeyRecord
from .deps import NodeDep
from .errors import ERROR_RESPONSES

router = APIRouter(responses=ERROR_RESPONSES, tags=["identity"])


class SigningKey(BaseModel):
    """Not E2B's: one published signing key and where it is in its life."""

    kid: str
    generation: int
    algorithm: str
    state: KeyState
    createdAt: datetime
    # When it signs (or signed) its first token.
    activeAt: datetime


def _key(key: SigningKeyRecord, state: KeyState) -> SigningKey:
    return SigningKey(
        kid=key.kid,
        generation=key.generation,
        algorithm=key.algorithm,
        state=state,
        createdAt=datetime.fromtimestamp(key.created_at, UTC),
        activeAt=datetime.fromtimestamp(key.active_at, UTC),
    )


def public_router(keys_of: Callable[[Request], PublicKeys]) -> APIRouter:
    """Discovery and the JWKS, served by a node or by the control plane from the store."""
    public = APIRouter(tags=["identity"])

    @public.get(DISCOVERY_PATH)
    async def openid_configuration(request: Request) -> JSONResponse:
        keys = keys_of(request)
        return _cached(keys.settings.discovery(), keys.settings.jwks_max_age)

    @public.get(JWKS_PATH)
    async def jwks(request: Request) -> JSONResponse:
        keys = keys_of(request)
        return _cached(await keys.jwks(), keys.settings.jwks_max_age)

    return public


def _cached(body: dict[str, Any], max_age: int) -> JSONResponse:
    return JSONResponse(body, headers={"Cache-Control": f"public, max-age={max_age}"})


def node_keys(request: Request) -> PublicKeys:
    keys: PublicKeys = request.app.state.node.credentials.identity
    return keys


@router.get("/identity/keys")
async def list_signing_keys(node: NodeDep) -> list[SigningKey]:
    """The keys in the JWKS, oldest first."""
    return [_key(key, state) for key, state in await node.credentials.identity.keys()]


@router.post("/identity/keys/rotate", status_code=201)
async def rotate_signing_key(node: NodeDep) -> SigningKey:
    """A new key: published now, signing after `identity.publish_ahead`."""
    identity = node.credentials.identity
    key = await identity.rotate()
    return _key(key, key_state(await identity.store.list(), key, identity.clock()))
