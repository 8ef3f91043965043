"""E2B's `GET /teams`: the team of the server's API key, its only one (a server has one
key and no accounts, so every caller is that team)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from .errors import ERROR_RESPONSES

TEAM_NAME = "default"
_TEAM_NAMESPACE = uuid.UUID("1b7e0d2c-5a7f-4c1e-9d43-2f6a0c8e7b15")


def team_id(api_key: str) -> str:
    """A UUID, as E2B's team ids are: the same for a key on every node, new with a new key."""
    return str(uuid.uuid5(_TEAM_NAMESPACE, api_key))


def teams_router(api_key: str) -> APIRouter:
    router = APIRouter(responses=ERROR_RESPONSES)
    team = {"teamID": team_id(api_key), "name": TEAM_NAME, "apiKey": api_key, "isDefault": True}

    @router.get("/teams")
    async def list_teams() -> list[dict[str, Any]]:
        """E2B's `Team` list, as `e2b auth login` and `e2b auth configure` read it."""
        return [team]

    return router
