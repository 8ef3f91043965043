"""The proxy's token check decides on the path exactly as the guest agent receives it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from agentenv.proxy.router import SandboxProxy, _token_ok
from agentenv.proxy.target import Target
from agentenv.runtime.sandboxes.routes import Route

TOKEN = "t0ken"
ROUTE = Route(host="10.0.0.2", access_token=TOKEN)
OPEN_ROUTE = Route(host="10.0.0.2", access_token=None)


def ok(method: str, path: str, headers: dict[bytes, bytes] | None = None) -> bool:
    target = Target("iabc", 49983, path)
    scope = {"method": method, "path": path.partition("?")[0]}
    return _token_ok(scope, target, headers or {}, TOKEN)


def test_the_token_opens_everything() -> None:
    assert ok("POST", "/process.Process/Start", {b"x-access-token": TOKEN.encode()})
    assert not ok("POST", "/process.Process/Start", {b"x-access-token": b"other"})


def test_health_and_signed_files_pass_without_it() -> None:
    assert ok("GET", "/health")
    assert ok("GET", "/files?path=/etc/hostname&signature=v1_abc")
    assert not ok("GET", "/files?path=/etc/hostname")
    assert not ok("POST", "/health")


@pytest.mark.parametrize(
    "path",
    [
        "/envs%3F/files?signature=x",  # decoded, the guest sees /envs?/files
        "/envs/%2E%2E/files?signature=x",
        "/x/files?signature=x",
        "/%66iles?signature=x",  # /files, but encoded: refused rather than guessed at
        "/files?path=a%26signature%3Dx",  # the signature is inside another parameter
        "/files?a=1;signature=x",  # aiohttp does not split on ';' either
        "/health%3F",
    ],
)
def test_encodings_do_not_pass_for_open_routes(path: str) -> None:
    assert not ok("GET", path)


class Guest:
    """Stands in for the sandbox: records the request target each request arrives with."""

    def __init__(self) -> None:
        self.targets: list[bytes] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.targets.append(request.url.raw_path)
        # A stream, as a real guest answers: the proxy relays it chunk by chunk.
        return httpx.Response(200, stream=httpx.ByteStream(b"{}"))


ROUTED = {b"e2b-sandbox-id": b"iabc"}


async def through_proxy(
    raw_path: bytes,
    query: bytes = b"",
    headers: dict[bytes, bytes] | None = None,
    route: Route = ROUTE,
    wake: Any = None,
    by_header: bool = True,
    sent: list[dict[str, Any]] | None = None,
) -> tuple[int, dict[str, Any] | None, Guest]:
    """One GET through the proxy to sandbox `iabc` (named by header, or by `raw_path`);
    the guest is an in-memory transport. With `wake`, the sandbox has no route until
    `wake` gives one (a paused sandbox). `sent` collects the answer's ASGI messages."""

    async def api(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("sandbox traffic reached the API")

    woken: list[Route] = []

    def resolve(sandbox_id: str) -> Route | None:
        if sandbox_id != "iabc":
            return None
        return route if wake is None else next(iter(woken), None)

    async def waking(sandbox_id: str) -> Route | None:
        found = await wake(sandbox_id)
        woken.extend([found] if found else [])
        return found

    proxy = SandboxProxy(api, resolve, wake=waking if wake else None)
    guest = Guest()
    client = httpx.AsyncClient(transport=httpx.MockTransport(guest.handle))
    proxy._upstreams.get = lambda sandbox_id, route: client  # type: ignore[method-assign]
    scope = {
        "type": "http",
        "method": "GET",
        "path": raw_path.decode("latin-1"),
        "raw_path": raw_path,
        "query_string": query,
        "headers": list(((dict(ROUTED) if by_header else {}) | (headers or {})).items()),
    }
    sent = [] if sent is None else sent
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays until the answer is sent
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with client:
        await proxy(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], json.loads(body) if body else None, guest


async def test_an_encoded_files_path_is_refused_before_the_guest() -> None:
    status, body, guest = await through_proxy(b"/envs%3F/files", b"signature=x")
    assert (status, guest.targets) == (401, [])
    assert body is not None and body["code"] == 401


async def test_a_signed_files_url_reaches_the_guest_as_sent() -> None:
    status, _, guest = await through_proxy(b"/files", b"path=%2Fetc&signature=v1_x")
    assert (status, guest.targets) == (200, [b"/files?path=%2Fetc&signature=v1_x"])


async def test_with_the_token_the_path_is_forwarded_unchanged() -> None:
    headers = {b"x-access-token": TOKEN.encode()}
    status, _, guest = await through_proxy(b"/envs%3F/files", b"signature=x", headers)
    assert (status, guest.targets) == (200, [b"/envs%3F/files?signature=x"])


@pytest.mark.parametrize(
    ("raw_path", "headers"),
    [
        (b"/health\xff", {}),
        (b"*", {}),  # OPTIONS *: appended to the guest's address, it would read as a port
        (b"/health", {b"e2b-sandbox-id": b"\xff\xfe"}),
        (b"/health", {b"e2b-sandbox-port": b"\xc3\xa9"}),
    ],
)
async def test_unreadable_routing_input_is_400(
    raw_path: bytes, headers: dict[bytes, bytes]
) -> None:
    # A sandbox without a token: nothing but the routing input stands before the guest.
    status, body, guest = await through_proxy(raw_path, b"", headers, OPEN_ROUTE)
    assert (status, guest.targets) == (400, [])
    assert body is not None and body["code"] == 400


async def test_a_paused_sandbox_that_asked_to_be_woken_gets_the_request() -> None:
    woken: list[str] = []

    async def wake(sandbox_id: str) -> Route | None:
        woken.append(sandbox_id)
        return OPEN_ROUTE

    status, _, guest = await through_proxy(b"/health", wake=wake)
    assert (status, woken, guest.targets) == (200, ["iabc"], [b"/health"])

    async def stays_asleep(sandbox_id: str) -> Route | None:
        return None

    status, body, guest = await through_proxy(b"/health", wake=stays_asleep)
    assert (status, guest.targets) == (502, [])
    assert body is not None and body["message"] == "The sandbox iabc was not found"
