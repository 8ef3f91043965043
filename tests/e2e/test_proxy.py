"""The data-plane proxy: any guest port by header, host or path; tokens; WebSockets; streaming."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest
import websockets
from e2b import Sandbox

from ..live import LiveServer, point_sdk, wait_for
from ..proxy.test_https_ports import self_signed
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm

GUEST_DIR = Path(__file__).with_name("guest")


def _serve_in_guest(server: LiveServer, sandbox: dict, command: str, port: int) -> None:
    run(server, sandbox, f"nohup {command} >/tmp/server.log 2>&1 &")
    headers = {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": str(port)}
    headers |= {"X-Access-Token": sandbox["envdAccessToken"]} if sandbox["envdAccessToken"] else {}

    def up() -> bool:
        try:
            return httpx.get(server.url + "/", headers=headers, timeout=2).status_code != 502
        except httpx.HTTPError:
            return False

    assert wait_for(up, timeout=30), run(server, sandbox, "cat /tmp/server.log")[0]


def test_guest_http_server_by_header_and_path(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    sid = sandbox["sandboxID"]
    run(server, sandbox, "mkdir -p /tmp/www && echo hello-from-guest > /tmp/www/index.txt")
    _serve_in_guest(server, sandbox, "python3 -m http.server 8080 -d /tmp/www", 8080)
    by_header = httpx.get(
        server.url + "/index.txt", headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8080"}
    )
    assert (by_header.status_code, by_header.text) == (200, "hello-from-guest\n")
    by_path = httpx.get(f"{server.url}/proxy/{sid}/8080/index.txt")
    assert (by_path.status_code, by_path.text) == (200, "hello-from-guest\n")
    closed = httpx.get(f"{server.url}/proxy/{sid}/8081/")
    assert closed.status_code == 502
    assert "not open" in closed.json()["message"]
    kill(server, sid)


def test_host_routing_with_a_sandbox_domain(fresh_server: LiveServer, vms: VmFactory) -> None:
    fresh_server.extra_env["AENV_SERVER_DOMAIN"] = "sbx.test"
    fresh_server.start()
    sandbox = vms.create(fresh_server)
    assert sandbox["domain"] == "sbx.test"
    sid = sandbox["sandboxID"]
    health = httpx.get(fresh_server.url + "/health", headers={"Host": f"49983-{sid}.sbx.test"})
    assert health.status_code == 204
    api_health = httpx.get(fresh_server.url + "/health")
    assert api_health.json()["status"] == "ok"
    kill(fresh_server, sid)


def test_an_https_port_through_get_host(
    fresh_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E2B's `httpsPorts`: a guest serving HTTPS with a self-signed certificate on port 3000
    is reached at `sandbox.get_host(3000)`, the proxy speaking TLS to it unverified."""
    fresh_server.extra_env["AENV_SERVER_DOMAIN"] = "sbx.test"
    fresh_server.start()
    point_sdk(monkeypatch, fresh_server.url)
    sandbox = Sandbox.create(network={"https_ports": [3000]})
    try:
        for path in (*self_signed(tmp_path), GUEST_DIR / "https_hello.py"):
            sandbox.files.write(f"/tmp/{path.name}", path.read_bytes())
        sandbox.commands.run(
            "python3 /tmp/https_hello.py 3000 /tmp/cert.pem /tmp/key.pem", background=True
        )
        host = sandbox.get_host(3000)
        assert host == f"3000-{sandbox.sandbox_id}.sbx.test"

        def get() -> httpx.Response:
            return httpx.get(fresh_server.url + "/", headers={"Host": host}, timeout=5)

        assert wait_for(lambda: get().status_code != 502, timeout=30)
        answer = get()
        assert (answer.status_code, answer.text) == (200, "hello over tls\n")
    finally:
        sandbox.kill()


def test_access_tokens(server: LiveServer, vms: VmFactory) -> None:
    first = vms.create(server, secure=True)
    second = vms.create(server, secure=True)
    token = first["envdAccessToken"]
    assert token and token != second["envdAccessToken"]
    url = server.url + "/process.Process/List"

    def call(extra: dict) -> httpx.Response:
        return httpx.post(url, json={}, headers={"E2b-Sandbox-Id": first["sandboxID"], **extra})

    assert call({}).status_code == 401
    assert call({"X-Access-Token": "wrong"}).status_code == 401
    assert call({"X-Access-Token": second["envdAccessToken"]}).status_code == 401
    assert call({"X-Access-Token": token}).status_code == 200
    with server.client() as api:
        assert api.post(f"/sandboxes/{first['sandboxID']}/pause").status_code == 204
        resumed = api.post(f"/sandboxes/{first['sandboxID']}/connect", json={})
        assert resumed.json()["envdAccessToken"] == token
        assert api.get(f"/sandboxes/{first['sandboxID']}").json()["envdAccessToken"] == token
    assert call({"X-Access-Token": token}).status_code == 200
    kill(server, first["sandboxID"])
    kill(server, second["sandboxID"])


async def echo_twice(ws_url: str) -> list[str]:
    """Two messages to `ws_echo.py` over a WebSocket; its replies."""
    async with websockets.connect(ws_url) as ws:
        replies = []
        for text in ("one", "two" * 100):
            await ws.send(text)
            replies.append(await asyncio.wait_for(ws.recv(), 10))
        return replies


def test_websocket_bridged(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    sid = sandbox["sandboxID"]
    headers = {"E2b-Sandbox-Id": sid, "X-Access-Token": sandbox["envdAccessToken"]}
    with httpx.Client(base_url=server.url, headers=headers) as envd:
        script = (GUEST_DIR / "ws_echo.py").read_bytes()
        assert envd.post("/files", params={"path": "/tmp/ws_echo.py"}, content=script).is_success
    _serve_in_guest(server, sandbox, "python3 /tmp/ws_echo.py 9000", 9000)

    ws_url = server.url.replace("http://", "ws://") + f"/proxy/{sid}/9000/chat"
    assert asyncio.run(echo_twice(ws_url)) == ["echo:one", "echo:" + "two" * 100]
    kill(server, sid)


def test_metrics_are_real(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    sid = sandbox["sandboxID"]
    with server.client() as api:
        samples = api.get(f"/sandboxes/{sid}/metrics").json()
    assert samples  # oldest first: the last was taken now
    sample = samples[-1]
    assert sample["cpuCount"] >= 1
    assert 0 < sample["memUsed"] < sample["memTotal"] <= 300 * 2**20
    assert 0 < sample["diskUsed"] < sample["diskTotal"]
    kill(server, sid)


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def test_large_upload_and_download_stream_through(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    sid = sandbox["sandboxID"]
    size = 256 * 2**20
    chunk = os.urandom(2**20)
    assert server.proc is not None
    rss_before = _rss_kib(server.proc.pid)
    peak = rss_before

    def body():
        nonlocal peak
        for _ in range(size // len(chunk)):
            peak = max(peak, _rss_kib(server.proc.pid))
            yield chunk

    headers = {
        "E2b-Sandbox-Id": sid,
        "Content-Type": "application/octet-stream",
        "X-Access-Token": sandbox["envdAccessToken"],
    }
    with httpx.Client(base_url=server.url, timeout=600) as envd:
        started = time.monotonic()
        written = envd.post(
            "/files", params={"path": "/tmp/big.bin"}, content=body(), headers=headers
        )
        assert written.status_code == 200, written.text
        received = 0
        with envd.stream("GET", "/files", params={"path": "/tmp/big.bin"}, headers=headers) as rsp:
            for part in rsp.iter_raw():
                received += len(part)
                peak = max(peak, _rss_kib(server.proc.pid))
        assert received == size, time.monotonic() - started
    # Neither direction may hold the file in the server's memory.
    assert (peak - rss_before) * 1024 < size / 4
    kill(server, sid)
