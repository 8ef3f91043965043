"""E2B's `httpsPorts`: the proxy speaks TLS to those guest ports, trusting any certificate
(a guest's is self-signed), and plain HTTP to the others; WebSockets alike."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import WSMsgType, web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentenv.proxy.router import SandboxProxy
from agentenv.runtime.sandboxes.routes import Route


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate nobody signed, as a guest's service has, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "guest")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return directory / "cert.pem", directory / "key.pem"


@pytest.fixture
async def https_guest(tmp_path: Path) -> AsyncIterator[int]:
    """A guest service on loopback serving HTTPS and a WebSocket echo; its port."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello over {request.scheme}")

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                await ws.send_str("echo " + message.data)
        return ws

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/ws", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*self_signed(tmp_path))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


def _proxy(route: Route) -> SandboxProxy:
    async def api(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("sandbox traffic reached the API")

    return SandboxProxy(api, lambda sandbox_id: route if sandbox_id == "ihttps" else None)


def _routing(port: int) -> dict[str, str]:
    return {"E2b-Sandbox-Id": "ihttps", "E2b-Sandbox-Port": str(port)}


async def test_an_https_port_is_reached_over_tls_and_others_are_not(https_guest: int) -> None:
    secure = Route("127.0.0.1", None, https_ports=frozenset({https_guest}))
    transport = httpx.ASGITransport(app=_proxy(secure))
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        answer = await client.get("/", headers=_routing(https_guest))
        assert (answer.status_code, answer.text) == (200, "hello over https")
    # Not listed: the proxy speaks plain HTTP to it, which a TLS server does not answer.
    plain = httpx.ASGITransport(app=_proxy(Route("127.0.0.1", None)))
    async with httpx.AsyncClient(transport=plain, base_url="http://proxy") as client:
        answer = await client.get("/", headers=_routing(https_guest))
        assert answer.status_code == 502


async def test_a_websocket_to_an_https_port_is_bridged_over_tls(https_guest: int) -> None:
    proxy = _proxy(Route("127.0.0.1", None, https_ports=frozenset({https_guest})))
    incoming = [
        {"type": "websocket.connect"},
        {"type": "websocket.receive", "text": "hi"},
    ]
    sent: list[dict[str, Any]] = []
    echoed = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await echoed.wait()  # then the client leaves
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("text"):
            echoed.set()

    headers = [(k.lower().encode(), v.encode()) for k, v in _routing(https_guest).items()]
    scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "query_string": b"",
             "headers": headers, "subprotocols": []}  # fmt: skip
    await proxy(scope, receive, send)
    assert sent[0]["type"] == "websocket.accept"
    assert {"type": "websocket.send", "text": "echo hi"} in sent
