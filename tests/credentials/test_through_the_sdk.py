"""Hosted secrets and workload identity through a real HTTP server: E2B's own SDK
(`Secret`, `AsyncSecret`) for the secrets, PyJWT for tokens against the JWKS it serves."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from e2b import AsyncSecret, Secret
from e2b.exceptions import SecretException
from sqlalchemy.ext.asyncio import AsyncEngine

from agentenv.cluster.postgres import free_port
from agentenv.config import Config
from agentenv.credentials.identity import DISCOVERY_PATH
from agentenv.credentials.placeholders import Credentials
from agentenv.state.sandboxes import SqlSandboxStore

from ..live import TEST_KEY
from .serving import node_api, serving
from .test_identity import AWS, sandbox

VALUE = "sk-live-do-not-print-me-0123456789"


@dataclass
class Served:
    url: str
    credentials: Credentials
    engine: AsyncEngine

    @property
    def opts(self) -> dict[str, Any]:
        """The SDK's connection options for this server."""
        return {"api_url": self.url, "api_key": TEST_KEY}


@pytest.fixture
async def served(tmp_path: Path, engine: AsyncEngine) -> AsyncIterator[Served]:
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    cfg.server.port = free_port()
    # A rotation's new key signs after a second; the issuer is this server (`advertise_url`).
    cfg.identity.publish_ahead = 1.0
    cfg.identity.rotation_period = 0.0
    app, node = node_api(cfg, engine)
    async with serving(app, cfg.server.port) as url:
        yield Served(url, node.credentials, engine)


async def test_secrets_round_trip_through_the_async_sdk(served: Served) -> None:
    created = await AsyncSecret.create("OpenAI", VALUE, {"team": "ml"}, **served.opts)
    assert created.secret_id.startswith("sec_")
    assert (created.name, created.version, created.metadata) == ("openai", 1, {"team": "ml"})
    assert created.created_at == created.updated_at and created.created_at.tzinfo is not None

    for key in (created.secret_id, "openai", "OpenAI"):
        info = await AsyncSecret.get_info(key, **served.opts)
        assert (info.secret_id, info.version) == (created.secret_id, 1)
    assert await AsyncSecret.exists("openai", **served.opts)
    assert not await AsyncSecret.exists("missing", **served.opts)

    updated = await AsyncSecret.update("openai", "v2", **served.opts)
    assert (updated.version, updated.metadata) == (2, {"team": "ml"})
    updated = await AsyncSecret.update(created.secret_id, "v3", {"team": "ops"}, **served.opts)
    assert (updated.version, updated.metadata) == (3, {"team": "ops"})
    assert updated.updated_at > created.updated_at
    assert await served.credentials.resolve("i1", "Bearer ${e2b.secrets.OpenAI}") == "Bearer v3"

    with pytest.raises(SecretException, match="'openai' already exists"):
        await AsyncSecret.create("openai", VALUE, **served.opts)
    assert await AsyncSecret.destroy("openai", **served.opts)
    assert not await AsyncSecret.destroy("openai", **served.opts)
    assert not await AsyncSecret.exists(created.secret_id, **served.opts)


async def test_no_route_shows_a_value(served: Served) -> None:
    headers = {"X-API-Key": TEST_KEY}
    async with httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        created = await client.post("/secrets", json={"name": "k", "value": VALUE})
        assert created.status_code == 201 and set(created.json()) == {
            "secretID", "name", "currentVersion", "metadata", "createdAt", "updatedAt",
        }  # fmt: skip
        answers = [
            created,
            await client.get("/secrets"),
            await client.get("/secrets/k"),
            await client.post("/secrets/k", json={"value": VALUE}),
            await client.post("/secrets", json={"name": "k", "value": VALUE}),
            await client.post("/secrets", json={"name": "sec_x", "value": VALUE}),
        ]
    assert [a.status_code for a in answers] == [201, 200, 200, 200, 409, 400]
    assert all("do-not-print" not in a.text for a in answers)


async def test_the_sync_sdk_pages_through_the_secrets(served: Served) -> None:
    def sync_calls() -> list[list[str]]:
        for i in range(5):
            Secret.create(f"s{i}", VALUE, **served.opts)
        paginator = Secret.list(limit=2, **served.opts)
        pages = []
        while paginator.has_next:
            pages.append([s.name for s in paginator.next_items()])
        return pages

    pages = await asyncio.to_thread(sync_calls)
    assert pages == [["s0", "s1"], ["s2", "s3"], ["s4"]]
    everything = await AsyncSecret.list(**served.opts).next_items()
    assert [s.name for s in everything] == [f"s{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"name": "a}b", "value": "v"}, "'{', '}' and control characters"),
        ({"name": "sec_1", "value": "v"}, "reserved for secret ids"),
        ({"name": "n", "value": "v", "metadata": {str(i): "" for i in range(33)}}, "32 entries"),
        ({"name": "n", "value": "v", "metadata": {"k": "v" * 1025}}, "1024 bytes"),
        ({"name": "n", "value": ""}, "value: 1 to"),
        ({"name": "n", "value": "v", "extra": 1}, "extra"),
    ],
)
async def test_bad_secrets_are_400s_naming_the_problem(
    served: Served, body: dict[str, Any], text: str
) -> None:
    headers = {"X-API-Key": TEST_KEY}
    async with httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        answer = await client.post("/secrets", json=body)
        cursor = await client.get("/secrets", params={"nextToken": "%%%"})
    assert answer.status_code == 400 and text in answer.json()["message"]
    assert answer.json()["code"] == 400
    assert cursor.status_code == 400


async def test_neither_create_nor_update_logs_the_value(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await AsyncSecret.create("logged", VALUE, {"m": "1"}, **served.opts)
    await AsyncSecret.update("logged", VALUE + "-2", **served.opts)
    with pytest.raises(SecretException):
        await AsyncSecret.create("logged", VALUE, **served.opts)
    with pytest.raises(SecretException):
        await AsyncSecret.create("bad}", VALUE, **served.opts)
    assert await served.credentials.resolve("i1", "${e2b.secrets.logged}") == VALUE + "-2"
    # The requests were logged (the server's access log), their bodies were not.
    assert "POST /secrets" in caplog.text
    assert "do-not-print" not in caplog.text


async def test_secrets_need_the_api_key_and_the_jwks_does_not(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        assert (await client.get("/secrets")).status_code == 401
        assert (await client.post("/identity/keys/rotate")).status_code == 401
        discovery = await client.get(DISCOVERY_PATH)
        assert discovery.status_code == 200
        jwks = await client.get(discovery.json()["jwks_uri"])
    assert discovery.json()["issuer"] == served.url
    assert discovery.json()["id_token_signing_alg_values_supported"] == ["ES256"]
    assert jwks.status_code == 200 and len(jwks.json()["keys"]) == 1
    assert "max-age=0" in jwks.headers["cache-control"]
    assert all("d" not in key for key in jwks.json()["keys"])


async def _verified(served: Served, token: str) -> dict[str, Any]:
    """As a verifier does it: discovery, then the JWKS it names (no cache), then PyJWT."""

    def verify() -> dict[str, Any]:
        discovery = httpx.get(served.url + DISCOVERY_PATH).json()
        client = jwt.PyJWKClient(discovery["jwks_uri"], cache_jwk_set=False, cache_keys=False)
        claims: dict[str, Any] = jwt.decode(
            token,
            client.get_signing_key_from_jwt(token),
            algorithms=discovery["id_token_signing_alg_values_supported"],
            audience=AWS["audience"],
            issuer=discovery["issuer"],
        )
        return claims

    return await asyncio.to_thread(verify)


async def test_tokens_verify_against_the_jwks_through_a_rotation(served: Served) -> None:
    store = SqlSandboxStore(served.engine, Config().node_name)
    await store.insert(sandbox("i1"))
    credentials = served.credentials

    async def token() -> str:
        # Each mint is a new token (the resolver would reuse the last one).
        return (await credentials.identity.mint(sandbox("i1"), "aws")).token

    before = await credentials.resolve("i1", "${e2b.identity.tokens.aws}")
    claims = await _verified(served, before)
    assert claims["sub"].startswith("spiffe://127.0.0.1/sandbox/i1")
    assert (claims["sandbox_id"], claims["template_id"]) == ("i1", "tpl1")

    headers = {"X-API-Key": TEST_KEY}
    async with httpx.AsyncClient(base_url=served.url, headers=headers) as client:
        rotated = await client.post("/identity/keys/rotate")
        assert rotated.status_code == 201 and rotated.json()["state"] == "pending"
        during = await token()
        assert jwt.get_unverified_header(during)["kid"] != rotated.json()["kid"]
        for signed in (before, during):
            await _verified(served, signed)
        await asyncio.sleep(max(0.0, _activation(rotated.json()) - time.time()) + 0.05)
        after = await token()
        assert jwt.get_unverified_header(after)["kid"] == rotated.json()["kid"]
        for signed in (before, during, after):
            await _verified(served, signed)
        keys = (await client.get("/identity/keys")).json()
    assert [k["state"] for k in keys] == ["retiring", "signing"]


def _activation(key: dict[str, Any]) -> float:
    return datetime.fromisoformat(key["activeAt"]).timestamp()
