"""A real HTTP server with the node's API (routes, auth, errors, request ids) whose node
has only its credentials: what the E2B SDK's `Secret` and token verifiers talk to, with
no VM behind it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from agentenv.api.app import build_api
from agentenv.config import Config
from agentenv.credentials.identity import IdentitySettings
from agentenv.credentials.placeholders import Credentials
from agentenv.credentials.sealing import server_sealer
from agentenv.observe.logs import RequestIds
from agentenv.state.sandboxes import SqlSandboxStore

from ..live import TEST_KEY


@dataclass
class CredentialsNode:
    """What the secret and identity routes use of a node."""

    credentials: Credentials


def node_api(cfg: Config, engine: AsyncEngine) -> tuple[Any, CredentialsNode]:
    """The node's API as `create_app` builds it, its node standing in for `Node.open`."""
    store = SqlSandboxStore(engine, cfg.node_name)
    sealer = server_sealer(cfg, TEST_KEY)
    node = CredentialsNode(Credentials.on(engine, store, sealer, IdentitySettings.of(cfg)))
    api = build_api(cfg, TEST_KEY)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await node.credentials.open()
        app.state.node = node
        yield

    api.router.lifespan_context = lifespan
    return RequestIds(api), node


@contextlib.asynccontextmanager
async def serving(app: Any, port: int = 0) -> AsyncIterator[str]:
    """`app` on a loopback port (0: a free one), in this event loop; its URL."""
    listener = socket.create_server(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    task = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
