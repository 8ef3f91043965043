"""Secrets and workload identity through a control plane in front of two nodes sharing a
state store (SQLite and PostgreSQL), all real HTTP servers: what one node stores, every
node resolves; the JWKS comes from the store, with no node and no API key."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import jwt
from e2b import AsyncSecret

from agentenv.cluster.postgres import free_port
from agentenv.config import Config
from agentenv.control.app import build_control_api
from agentenv.credentials.identity import DISCOVERY_PATH
from agentenv.observe.logs import RequestIds
from agentenv.state.nodes import NodeCapacity, NodeRegistry
from agentenv.state.sandboxes import SqlSandboxStore, open_engine

from ..credentials.serving import node_api, serving
from ..credentials.test_identity import AWS, sandbox
from ..live import TEST_KEY


def _config(tmp_path: Path, state_url: str, name: str, issuer: str) -> Config:
    cfg = Config()
    cfg.paths.home = str(tmp_path / name)
    cfg.state.url = state_url
    cfg.server.node_name = name
    # One issuer for the cluster: the control plane's address.
    cfg.identity.issuer = issuer
    return cfg


async def test_secrets_and_identity_through_the_control_plane(
    tmp_path: Path, state_url: str
) -> None:
    control_port = free_port()
    issuer = f"http://127.0.0.1:{control_port}"
    engine = await open_engine(state_url)
    nodes = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in ("n1", "n2"):
            app, node = node_api(_config(tmp_path, state_url, name, issuer), engine)
            url = await stack.enter_async_context(serving(app))
            await NodeRegistry(engine).register(name, url, NodeCapacity(memory_mb=4096))
            nodes[name] = node
        control = RequestIds(build_control_api(_config(tmp_path, state_url, "c", issuer), TEST_KEY))
        url = await stack.enter_async_context(serving(control, control_port))
        opts: dict[str, Any] = {"api_url": url, "api_key": TEST_KEY}

        created = await AsyncSecret.create("Shared", "s3cr3t", {"k": "v"}, **opts)
        assert (await AsyncSecret.get_info("shared", **opts)).secret_id == created.secret_id
        assert (await AsyncSecret.update("shared", "v2", **opts)).version == 2
        assert [s.name for s in await AsyncSecret.list(**opts).next_items()] == ["shared"]
        # Whichever node stored it, every node resolves it.
        for node in nodes.values():
            assert await node.credentials.resolve("i1", "${e2b.secrets.shared}") == "v2"

        await SqlSandboxStore(engine, "n2").insert(sandbox("i1"))
        token = await nodes["n2"].credentials.resolve("i1", "${e2b.identity.tokens.aws}")
        async with httpx.AsyncClient(base_url=url) as client:
            discovery = (await client.get(DISCOVERY_PATH)).json()
            jwks = (await client.get(discovery["jwks_uri"])).json()
            rotated = await client.post("/identity/keys/rotate", headers={"X-API-Key": TEST_KEY})
            listed = await client.get("/identity/keys", headers={"X-API-Key": TEST_KEY})
            after = (await client.get(discovery["jwks_uri"])).json()
        assert discovery["issuer"] == issuer
        key = jwt.PyJWKSet.from_dict(jwks)[jwt.get_unverified_header(token)["kid"]]
        claims = jwt.decode(
            token, key, algorithms=["ES256"], audience=AWS["audience"], issuer=issuer
        )
        assert claims["sub"] == "spiffe://127.0.0.1/sandbox/i1"
        # Rotated on a node, published by the control plane at once.
        assert rotated.status_code == 201 and len(listed.json()) == 2
        assert {k["kid"] for k in after["keys"]} == {k["kid"] for k in jwks["keys"]} | {
            rotated.json()["kid"]
        }

        assert await AsyncSecret.destroy("shared", **opts)
        assert not await AsyncSecret.exists("shared", **opts)
        results = await asyncio.gather(
            *(n.credentials.resolve("i1", "${e2b.secrets.shared}") for n in nodes.values()),
            return_exceptions=True,
        )
        assert all("no such secret" in str(r) for r in results)
    await engine.dispose()
