"""The guest agent over real HTTP: a subprocess on 127.0.0.1 with ``--rootfs /`` (run as root)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentenv.errors import Unavailable
from agentenv.guest import client as client_module
from agentenv.guest.agent import init_secret
from agentenv.guest.agent.signing import READ, WRITE, file_signature
from agentenv.guest.client import AgentClient

REPO = Path(__file__).resolve().parents[2]
STREAM = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
NOBODY = {"Authorization": "Basic " + base64.b64encode(b"nobody:").decode()}
ROOT = {"Authorization": "Basic " + base64.b64encode(b"root:").decode()}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent tests need root")

# The host's /init secret, which a VM's agent reads through the VMM, comes from a file here.
SECRET = init_secret.new_secret()
SECRET_FILE = Path(f"/tmp/aenv-agent-test-{os.getpid()}.secret")
INIT = {init_secret.HEADER: SECRET}


@dataclass
class Agent:
    url: str
    proc: subprocess.Popen[bytes]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


def _spawn(rootfs: str = "/") -> Agent:
    """Start an agent; AENV_AGENT_PYTHON/AENV_AGENT_PYTHONPATH select another interpreter,
    e.g. Debian's python3 with bookworm's aiohttp 3.8.4."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    python = os.environ.get("AENV_AGENT_PYTHON", sys.executable)
    env = dict(os.environ)
    if "AENV_AGENT_PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["AENV_AGENT_PYTHONPATH"]
    cmd = [python, "-m", "agentenv.guest.agent", "--host", "127.0.0.1", "--port", str(port)]
    SECRET_FILE.write_text(SECRET)
    cmd += ["--init-secret-file", str(SECRET_FILE)]
    proc = subprocess.Popen([*cmd, "--rootfs", rootfs], cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 204:
                return Agent(url, proc)
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("agent did not become healthy")


def _stop(agent: Agent) -> None:
    agent.proc.terminate()
    try:
        agent.proc.wait(5)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        agent.proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _secret_file_removed() -> Iterator[None]:
    """The secret file every agent here reads goes with the module (it is in /tmp)."""
    yield
    SECRET_FILE.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    a = _spawn()
    yield a
    _stop(a)


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=agent.url, timeout=30, headers=INIT) as c:
        yield c


def envelope(msg: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


def parse(buf: bytes) -> tuple[list[tuple[int, dict[str, Any]]], bytes]:
    """Split complete envelopes off ``buf``; returns them and the leftover bytes."""
    out = []
    while len(buf) >= 5:
        flags, n = struct.unpack(">BI", buf[:5])
        if len(buf) < 5 + n:
            break
        out.append((flags, json.loads(buf[5 : 5 + n])))
        buf = buf[5 + n :]
    return out, buf


class Stream:
    """A server-streaming call read message by message."""

    def __init__(self, resp: httpx.Response) -> None:
        self.resp = resp
        self._it = resp.aiter_raw()
        self._buf = b""
        self._ready: list[tuple[int, dict[str, Any]]] = []
        self.end: dict[str, Any] | None = None

    async def next(self) -> dict[str, Any] | None:
        """The next message, or None after the end-stream envelope (kept in ``end``)."""
        while not self._ready:
            self._buf += await self._it.__anext__()
            got, self._buf = parse(self._buf)
            self._ready += got
        flags, msg = self._ready.pop(0)
        if flags & 0x02:
            self.end = msg
            return None
        return msg

    async def rest(self) -> list[dict[str, Any]]:
        msgs = []
        while (m := await self.next()) is not None:
            msgs.append(m)
        return msgs


async def open_stream(
    c: httpx.AsyncClient, method: str, msg: dict[str, Any], headers: dict[str, str] | None = None
) -> Stream:
    req = c.build_request("POST", method, content=envelope(msg), headers=STREAM | (headers or {}))
    resp = await c.send(req, stream=True)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/connect+json"
    return Stream(resp)


async def run(c: httpx.AsyncClient, msg: dict[str, Any], headers: dict[str, str] | None = None):
    """Start a process and collect (stdout, stderr, end event, end-stream)."""
    s = await open_stream(c, "/process.Process/Start", msg, headers)
    msgs = await s.rest()
    await s.resp.aclose()
    out = err = b""
    end = None
    if msgs:
        assert "start" in msgs[0]["event"], msgs[0]
    for m in msgs:
        data = m["event"].get("data", {})
        out += base64.b64decode(data.get("stdout", "") or data.get("pty", ""))
        err += base64.b64decode(data.get("stderr", ""))
        end = m["event"].get("end", end)
    return out, err, end, s.end


def sh(script: str, **extra: Any) -> dict[str, Any]:
    return {"process": {"cmd": "/bin/sh", "args": ["-c", script], **extra}, "stdin": False}


async def rpc(c: httpx.AsyncClient, method: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return await c.post(method, json=body, **kw)


# -- plain HTTP --------------------------------------------------------------------------------


async def test_a_quiet_process_outlasts_the_hosts_read_timeout(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host asks for keepalives (a build step quiet for minutes, pip installing)."""
    monkeypatch.setattr(client_module, "KEEPALIVE_SECONDS", 0.2)
    lines: list[str] = []
    code = await AgentClient(agent.url, timeout=0.2).run(
        ["sh", "-c", "sleep 1.5; echo done"], output=lines.append
    )
    assert (code, lines) == (0, ["done"])


async def test_host_health_probe(agent: Agent) -> None:
    assert await AgentClient(agent.url).healthy()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = s.getsockname()[1]
    assert not await AgentClient(f"http://127.0.0.1:{nobody}").healthy()


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"])
async def test_a_host_call_the_guest_does_not_serve_is_unavailable(
    answer: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest that says nothing, or refuses: a 503 naming the route, whatever the cause."""

    async def guest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer is not None:
            writer.write(answer)
            await writer.drain()
            writer.close()

    server = await asyncio.start_server(guest, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr("agentenv.guest.client.HOST_CALL_TIMEOUT", 0.3)
    async with server:
        client = AgentClient(f"http://127.0.0.1:{port}", timeout=0.1)
        expected = "did not answer /init: ReadTimeout" if answer is None else "failed /init"
        with pytest.raises(Unavailable, match=expected):
            await client.init({}, None)


async def test_health_envs_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).status_code == 204
    r = await client.post("/init", json={"envVars": {"FROM_INIT": "yes", "OVERRIDE": "init"}})
    assert r.status_code == 204
    assert (await client.get("/envs")).json()["FROM_INIT"] == "yes"
    m = (await client.get("/metrics")).json()
    assert set(m) == {"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache"} | {
        "disk_used",
        "disk_total",
        "idle_seconds",
        "reclaims",
    }
    assert m["mem_total"] > m["mem_used"] > 0 and m["disk_total"] > 0
    # /init was use, /metrics is not.
    assert m["idle_seconds"] < 5 and m["reclaims"] == 0


# -- process -----------------------------------------------------------------------------------


async def test_the_sandbox_log_records_processes(client: httpx.AsyncClient) -> None:
    before = int(time.time() * 1000)
    out, _, end, _ = await run(client, sh("echo logged; exit 3"))
    assert out == b"logged\n" and end["exitCode"] == 3
    entries = (await client.get("/logs", params={"start": before})).json()["entries"]
    started = [e for e in entries if e["message"] == "process started"]
    ended = [e for e in entries if e["message"] == "process ended"]
    assert started[-1]["fields"]["cmd"] == "/bin/sh -c echo logged; exit 3"
    assert ended[-1]["fields"] == {"pid": started[-1]["fields"]["pid"], "exitCode": "3"}
    assert {e["level"] for e in entries} == {"info"} and entries[0]["timestampMs"] >= before
    future = int(time.time() * 1000) + 60_000
    assert (await client.get("/logs", params={"start": future})).json()["entries"] == []
    assert (await client.get("/logs", params={"start": "x"})).status_code == 400


async def test_start_content_length(client: httpx.AsyncClient) -> None:
    out, err, end, tail = await run(client, sh("echo out; echo err >&2; exit 3"))
    assert (out, err) == (b"out\n", b"err\n")
    assert end == {
        "exitCode": 3,
        "exited": True,
        "status": "exit status 3",
        "error": "exit status 3",
    }
    assert tail == {}


async def test_start_chunked_request(client: httpx.AsyncClient) -> None:
    body = envelope(sh("echo chunked"))

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]
            await asyncio.sleep(0.01)

    req = client.build_request("POST", "/process.Process/Start", content=pieces(), headers=STREAM)
    assert "content-length" not in req.headers
    resp = await client.send(req, stream=True)
    msgs = await Stream(resp).rest()
    assert msgs[0]["event"]["start"]["pid"] > 0
    assert base64.b64decode(msgs[1]["event"]["data"]["stdout"]) == b"chunked\n"
    assert msgs[-1]["event"]["end"] == {"exited": True, "status": "exit status 0"}


async def test_env_cwd_and_user(client: httpx.AsyncClient) -> None:
    await client.post("/init", json={"envVars": {"FROM_INIT": "yes", "OVERRIDE": "init"}})
    script = 'echo "$FROM_INIT $OVERRIDE $HOME $USER $LOGNAME"; pwd; id -u'
    out, _, end, _ = await run(client, sh(script, envs={"OVERRIDE": "cmd"}, cwd="/tmp"))
    assert out.decode().splitlines() == ["yes cmd /root root root", "/tmp", "0"]
    assert end == {"exited": True, "status": "exit status 0"}
    out, _, _, _ = await run(client, sh("id -u; echo $USER; pwd"), NOBODY)
    assert out.decode().splitlines() == ["65534", "nobody", "/"]  # home /nonexistent: falls to /


async def test_missing_cwd_is_invalid_argument(client: httpx.AsyncClient) -> None:
    _, _, end, tail = await run(client, sh("true", cwd="/does/not/exist"))
    assert end is None and tail["error"]["code"] == "invalid_argument"


async def test_deadline_kills_process(client: httpx.AsyncClient) -> None:
    t0 = time.monotonic()
    _, _, end, tail = await run(client, sh("sleep 30"), {"Connect-Timeout-Ms": "500"})
    assert time.monotonic() - t0 < 5
    assert end["exitCode"] == -1 and end["status"] == "signal: killed" and "exited" not in end
    assert tail["error"]["code"] == "deadline_exceeded"


async def test_background_list_connect_kill(client: httpx.AsyncClient, tmp_path: Path) -> None:
    marker = tmp_path / "after-disconnect"
    s = await open_stream(
        client, "/process.Process/Start", sh(f"sleep 1; touch {marker}; sleep 60"), {"X": "1"}
    )
    pid = (await s.next())["event"]["start"]["pid"]
    await s.resp.aclose()  # client disconnect must not kill the process
    await asyncio.sleep(1.5)
    assert marker.exists()
    listed = (await rpc(client, "/process.Process/List", {})).json()["processes"]
    assert any(p["pid"] == pid and p["config"]["cmd"] == "/bin/sh" for p in listed)

    conn = await open_stream(client, "/process.Process/Connect", {"process": {"pid": pid}})
    assert (await conn.next())["event"]["start"]["pid"] == pid
    kill = {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    assert (await rpc(client, "/process.Process/SendSignal", kill)).json() == {}
    rest = await conn.rest()
    assert rest[-1]["event"]["end"]["status"] == "signal: killed" and conn.end == {}
    listed = (await rpc(client, "/process.Process/List", {})).json()["processes"]
    assert all(p["pid"] != pid for p in listed)
    r = await rpc(client, "/process.Process/SendSignal", kill)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    gone = await open_stream(client, "/process.Process/Connect", {"process": {"pid": pid}})
    assert await gone.next() is None and gone.end["error"]["code"] == "not_found"


async def test_fan_out_and_keepalive(client: httpx.AsyncClient) -> None:
    s = await open_stream(
        client,
        "/process.Process/Start",
        sh("sleep 1.5; echo tick"),
        {"Keepalive-Ping-Interval": "1"},
    )
    pid = (await s.next())["event"]["start"]["pid"]
    conn = await open_stream(client, "/process.Process/Connect", {"process": {"pid": pid}})
    await conn.next()
    a, b = await asyncio.gather(s.rest(), conn.rest())
    assert {"event": {"keepalive": {}}} in a
    for msgs in (a, b):
        data = [m["event"]["data"]["stdout"] for m in msgs if "data" in m["event"]]
        assert base64.b64decode("".join(data)) == b"tick\n"
        assert "end" in msgs[-1]["event"]


async def test_slow_subscriber_does_not_stall_others(
    agent: Agent, client: httpx.AsyncClient
) -> None:
    size = 8 * 1024 * 1024
    slow = await open_stream(
        client, "/process.Process/Start", sh(f"sleep 0.5; head -c {size} /dev/zero")
    )
    pid = (await slow.next())["event"]["start"]["pid"]
    fast = await open_stream(client, "/process.Process/Connect", {"process": {"pid": pid}})
    await fast.next()
    msgs = await asyncio.wait_for(fast.rest(), 30)  # `slow` is never read meanwhile
    got = sum(len(base64.b64decode(m["event"]["data"]["stdout"])) for m in msgs[:-1])
    assert got == size and "end" in msgs[-1]["event"]
    assert all(len(base64.b64decode(m["event"]["data"]["stdout"])) <= 32768 for m in msgs[:-1])
    await slow.resp.aclose()
    children = Path(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children").read_text().split()
    zombies = [c for c in children if Path(f"/proc/{c}/stat").read_text().split()[2] == "Z"]
    assert not zombies


async def test_stdin_send_and_close(client: httpx.AsyncClient) -> None:
    start = {"process": {"cmd": "/bin/cat"}, "stdin": True, "tag": "cat-1"}
    s = await open_stream(client, "/process.Process/Start", start)
    pid = (await s.next())["event"]["start"]["pid"]
    inp = {"process": {"tag": "cat-1"}, "input": {"stdin": base64.b64encode(b"hello\n").decode()}}
    assert (await rpc(client, "/process.Process/SendInput", inp)).json() == {}
    chunks = [envelope({"start": {"process": {"pid": pid}}})]
    chunks.append(envelope({"data": {"input": {"stdin": base64.b64encode(b"more\n").decode()}}}))
    r = await client.post("/process.Process/StreamInput", content=b"".join(chunks), headers=STREAM)
    msgs, _ = parse(r.content)
    assert msgs == [(0, {}), (2, {})]
    assert (
        await rpc(client, "/process.Process/CloseStdin", {"process": {"pid": pid}})
    ).json() == {}
    rest = await s.rest()
    data = b"".join(base64.b64decode(m["event"]["data"]["stdout"]) for m in rest[:-1])
    assert data == b"hello\nmore\n" and rest[-1]["event"]["end"]["status"] == "exit status 0"


async def test_pty_and_resize(client: httpx.AsyncClient) -> None:
    start = {
        "process": {"cmd": "/bin/sh", "envs": {"PS1": "$ "}},
        "pty": {"size": {"cols": 100, "rows": 30}},
    }
    s = await open_stream(client, "/process.Process/Start", start)
    pid = (await s.next())["event"]["start"]["pid"]

    async def send_and_wait(line: str, want: bytes) -> None:
        data = {"pty": base64.b64encode(line.encode()).decode()}
        await rpc(client, "/process.Process/SendInput", {"process": {"pid": pid}, "input": data})
        seen = b""
        while want not in seen:
            m = await asyncio.wait_for(s.next(), 10)
            seen += base64.b64decode(m["event"].get("data", {}).get("pty", ""))

    await send_and_wait("stty size; tty\n", b"30 100")
    resize = {"process": {"pid": pid}, "pty": {"size": {"cols": 120, "rows": 40}}}
    assert (await rpc(client, "/process.Process/Update", resize)).json() == {}
    await send_and_wait("stty size\n", b"40 120")
    await send_and_wait("exit 7\n", b"")
    rest = await s.rest()
    assert rest[-1]["event"]["end"]["exitCode"] == 7


# -- files ---------------------------------------------------------------------------------------


async def test_files_upload_download(client: httpx.AsyncClient, tmp_path: Path) -> None:
    target = str(tmp_path / "sub" / "a.txt")
    files = {"file": (target, b"multipart body")}
    r = await client.post("/files", params={"path": target}, files=files)
    assert r.json() == [{"name": "a.txt", "type": "file", "path": target}]
    r = await client.get("/files", params={"path": target})
    assert r.content == b"multipart body"
    assert r.headers["content-type"] == "application/octet-stream"

    two = [("file", (str(tmp_path / n), n.encode())) for n in ("x", "y")]
    r = await client.post("/files", files=two)
    assert [e["path"] for e in r.json()] == [str(tmp_path / "x"), str(tmp_path / "y")]
    assert (tmp_path / "y").read_bytes() == b"y"

    raw = {"Content-Type": "application/octet-stream"}
    r = await client.post("/files", params={"path": target}, content=b"raw", headers=raw)
    assert r.status_code == 200 and Path(target).read_bytes() == b"raw"
    gz = raw | {"Content-Encoding": "gzip"}
    r = await client.post(
        "/files", params={"path": target}, content=gzip.compress(b"z"), headers=gz
    )
    assert r.status_code == 200 and Path(target).read_bytes() == b"z"

    owned = str(tmp_path / "owned" / "n.txt")
    await client.post(
        "/files", params={"path": owned, "username": "nobody"}, content=b"n", headers=raw
    )
    assert os.stat(owned).st_uid == 65534 and os.stat(Path(owned).parent).st_uid == 65534

    r = await client.get("/files", params={"path": str(tmp_path / "missing")})
    assert r.status_code == 404 and r.json()["code"] == 404
    assert (await client.get("/files", params={"path": str(tmp_path)})).status_code == 400
    r = await client.post(
        "/files", params={"path": "rel.txt", "username": "root"}, content=b"r", headers=raw
    )
    assert r.json()[0]["path"] == "/root/rel.txt"
    os.unlink("/root/rel.txt")


async def test_large_upload_is_streamed(
    agent: Agent, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    size, chunk = 50 * 1024 * 1024, b"x" * (1024 * 1024)
    base = agent.rss_kib()
    peak = base

    async def body() -> AsyncIterator[bytes]:
        nonlocal peak
        for _ in range(size // len(chunk)):
            yield chunk
            peak = max(peak, agent.rss_kib())

    target = tmp_path / "big.bin"
    headers = {"Content-Type": "application/octet-stream"}
    r = await client.post("/files", params={"path": str(target)}, content=body(), headers=headers)
    assert r.status_code == 200 and target.stat().st_size == size
    assert peak - base < 15 * 1024, f"agent RSS grew by {(peak - base) // 1024} MiB"
    r = await client.get("/files", params={"path": str(target)})
    assert len(r.content) == size


async def test_files_of_pseudo_filesystems_are_read_to_their_end(
    client: httpx.AsyncClient,
) -> None:
    """procfs and sysfs report sizes of 0 or 4096; their files are sent as read."""
    for path in ("/proc/sys/kernel/random/boot_id", "/sys/kernel/mm/transparent_hugepage/enabled"):
        if not os.path.exists(path):
            continue
        r = await client.get("/files", params={"path": path})
        assert r.status_code == 200
        assert r.content == Path(path).read_bytes() != b""


# -- filesystem ------------------------------------------------------------------------------------


async def test_file_metadata_as_envd_keeps_it(client: httpx.AsyncClient, tmp_path: Path) -> None:
    """`X-Metadata-*` headers become `user.e2b.*` xattrs: shown by upload, Stat, ListDir and
    Move; an upload without them clears them; xattrs set in the guest show too."""
    fs = "/filesystem.Filesystem/"
    target = tmp_path / "m.txt"
    tagged = {"X-Metadata-Author": "mish", "x-metadata-purpose": "upload"}
    expected = {"author": "mish", "purpose": "upload"}
    r = await client.post(
        "/files", params={"path": str(target)}, files={"file": b"1"}, headers=tagged
    )
    assert r.json()[0]["metadata"] == expected
    stat_entry = (await rpc(client, fs + "Stat", {"path": str(target)})).json()["entry"]
    assert stat_entry["metadata"] == expected
    listed = (await rpc(client, fs + "ListDir", {"path": str(tmp_path)})).json()["entries"]
    assert [e.get("metadata") for e in listed if e["name"] == "m.txt"] == [expected]
    moved = await rpc(
        client, fs + "Move", {"source": str(target), "destination": str(target) + "2"}
    )
    assert moved.json()["entry"]["metadata"] == expected

    octet = {"Content-Type": "application/octet-stream", "X-Metadata-Stage": "two"}
    r = await client.post("/files", params={"path": str(target) + "2"}, content=b"2", headers=octet)
    assert r.json()[0]["metadata"] == {"stage": "two"}
    r = await client.post("/files", params={"path": str(target) + "2"}, files={"file": b"3"})
    assert "metadata" not in r.json()[0]
    assert os.listxattr(str(target) + "2") == []

    os.setxattr(str(target) + "2", "user.e2b.by-hand", b"yes")
    os.setxattr(str(target) + "2", "user.other", b"not ours")
    stat_entry = (await rpc(client, fs + "Stat", {"path": str(target) + "2"})).json()["entry"]
    assert stat_entry["metadata"] == {"by-hand": "yes"}

    for headers, message in [
        ({"X-Metadata-K": "café".encode()}, "non-printable-ASCII"),
        ({"X-Metadata-" + "k" * 247: "v"}, "exceeds 246 bytes"),
        ({f"X-Metadata-K{i}": "v" * 200 for i in range(20)}, "total metadata size"),
    ]:
        r = await client.post(
            "/files", params={"path": str(target)}, files={"file": b"x"}, headers=headers
        )
        assert r.status_code == 400 and message in r.json()["message"], r.text


async def test_filesystem_rpcs(client: httpx.AsyncClient, tmp_path: Path) -> None:
    fs = "/filesystem.Filesystem/"
    d = tmp_path / "d" / "e"
    r = await rpc(client, fs + "MakeDir", {"path": str(d)})
    assert r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    r = await rpc(client, fs + "MakeDir", {"path": str(d)})
    assert r.status_code == 409 and r.json()["code"] == "already_exists"
    (d / "f.txt").write_text("12345")
    r = await rpc(client, fs + "MakeDir", {"path": str(d / "f.txt")})
    assert r.json()["code"] == "invalid_argument"

    entry = (await rpc(client, fs + "Stat", {"path": str(d / "f.txt")})).json()["entry"]
    assert entry["size"] == "5" and entry["permissions"] == "-rw-r--r--"
    assert entry["owner"] == "root" and entry["modifiedTime"].endswith("Z")
    (tmp_path / "link").symlink_to(d)
    entry = (await rpc(client, fs + "Stat", {"path": str(tmp_path / "link")})).json()["entry"]
    assert entry["isSymlink"] and entry["symlinkTarget"] == str(d)
    r = await rpc(client, fs + "Stat", {"path": str(tmp_path / "nope")})
    assert r.status_code == 404 and r.json()["code"] == "not_found"

    entries = (await rpc(client, fs + "ListDir", {"path": str(tmp_path), "depth": 1})).json()
    assert sorted(e["path"] for e in entries["entries"]) == [
        str(tmp_path / "d"),
        str(tmp_path / "link"),
    ]
    deep = (await rpc(client, fs + "ListDir", {"path": str(tmp_path), "depth": 3})).json()
    assert str(d / "f.txt") in [e["path"] for e in deep["entries"]]
    r = await rpc(client, fs + "ListDir", {"path": str(d / "f.txt")})
    assert r.json()["code"] == "invalid_argument"
    r = await rpc(client, fs + "ListDir", {"path": str(tmp_path / "nope")})
    assert r.json()["code"] == "not_found"

    move = {"source": str(d / "f.txt"), "destination": str(tmp_path / "m" / "g.txt")}
    assert (await rpc(client, fs + "Move", move)).json()["entry"]["name"] == "g.txt"
    assert (await rpc(client, fs + "Remove", {"path": str(tmp_path / "d")})).json() == {}
    assert not (tmp_path / "d").exists()
    assert (await rpc(client, fs + "Remove", {"path": str(tmp_path / "d")})).status_code == 200


async def test_watch_dir_stream_and_polling(client: httpx.AsyncClient, tmp_path: Path) -> None:
    fs = "/filesystem.Filesystem/"
    s = await open_stream(client, fs + "WatchDir", {"path": str(tmp_path), "recursive": True})
    assert await s.next() == {"start": {}}
    (tmp_path / "new.txt").write_text("x")
    first = await asyncio.wait_for(s.next(), 5)
    assert first == {"filesystem": {"name": "new.txt", "type": "EVENT_TYPE_CREATE"}}
    await s.resp.aclose()

    r = await rpc(client, fs + "CreateWatcher", {"path": str(tmp_path), "includeEntry": True})
    wid = r.json()["watcherId"]
    (tmp_path / "new.txt").unlink()
    (tmp_path / "other").write_text("y")
    await asyncio.sleep(0.2)
    events = (await rpc(client, fs + "GetWatcherEvents", {"watcherId": wid})).json()["events"]
    kinds = [(e["name"], e["type"]) for e in events]
    assert ("new.txt", "EVENT_TYPE_REMOVE") in kinds and ("other", "EVENT_TYPE_CREATE") in kinds
    assert any(e.get("entry", {}).get("name") == "other" for e in events)
    assert (await rpc(client, fs + "RemoveWatcher", {"watcherId": wid})).json() == {}
    r = await rpc(client, fs + "GetWatcherEvents", {"watcherId": wid})
    assert r.json()["code"] == "not_found"


# -- access token and a separate rootfs ------------------------------------------------------------


async def test_access_token() -> None:
    a = _spawn()
    try:
        async with httpx.AsyncClient(base_url=a.url) as c:
            r = await c.post("/init", json={"accessToken": "s3cret"}, headers=INIT)
            assert r.status_code == 204
            assert (await c.get("/health")).status_code == 204
            assert (await c.get("/envs")).status_code == 401
            ok = {"X-Access-Token": "s3cret"}
            assert (await c.get("/envs", headers=ok)).status_code == 200
            r = await rpc(c, "/process.Process/List", {})
            assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
            assert (await rpc(c, "/process.Process/List", {}, headers=ok)).status_code == 200
            assert (await c.get("/files", params={"path": "/etc/hostname"})).status_code == 401
            r = await c.get("/files", params={"path": "/etc/hostname"}, headers=ok)
            assert r.status_code == 200
            raw = b"/etc/hostname:read::s3cret"
            import hashlib

            sig = "v1_" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")
            r = await c.get("/files", params={"path": "/etc/hostname", "signature": sig})
            assert r.status_code == 200
    finally:
        _stop(a)


async def test_signed_file_urls_answer_as_envd() -> None:
    """A signed URL works until it expires; each refusal says why, in envd's words."""
    a = _spawn()
    try:
        async with httpx.AsyncClient(base_url=a.url) as c:
            await c.post("/init", json={"accessToken": "s3cret"}, headers=INIT)
            path = "/etc/hostname"
            soon, past = str(int(time.time()) + 60), str(int(time.time()) - 60)

            def signed(operation: str, expiration: str) -> dict[str, str]:
                sig = file_signature(path, operation, "", "s3cret", expiration)
                return {"path": path, "signature": sig, "signature_expiration": expiration}

            assert (await c.get("/files", params=signed(READ, soon))).status_code == 200
            cases = [
                ({"path": path}, {}, "missing signature query parameter"),
                (signed(WRITE, soon), {}, "invalid signature"),
                (signed(READ, past), {}, "signature is already expired"),
                (
                    signed(READ, soon),
                    {"X-Access-Token": "x"},
                    "access token present in header but does not match",
                ),
            ]
            for params, headers, message in cases:
                r = await c.get("/files", params=params, headers=headers)
                assert (r.status_code, r.json()) == (401, {"code": 401, "message": message})
    finally:
        _stop(a)


async def test_init_is_the_hosts_alone() -> None:
    """Nobody without the host's secret sets a token, env vars or a default user; the
    sandbox's own token does not open /init either."""
    a = _spawn()
    try:
        async with httpx.AsyncClient(base_url=a.url) as c:
            assert (await c.post("/init", json={"accessToken": "owner"}, headers=INIT)).is_success
            owner = {"X-Access-Token": "owner"}
            attempts: list[dict[str, str]] = [
                {},
                {init_secret.HEADER: ""},
                {init_secret.HEADER: "0" * init_secret.SECRET_HEX_CHARS},
                {init_secret.HEADER: SECRET[:-1]},
                owner,
            ]
            for headers in attempts:
                r = await c.post("/init", json={"accessToken": "thief"}, headers=headers)
                assert r.status_code == 401, headers
                assert r.json()["code"] == 401
            # The owner still gets in; the would-be thief's token does not.
            assert (await c.get("/envs", headers=owner)).status_code == 200
            assert (await c.get("/envs", headers={"X-Access-Token": "thief"})).status_code == 401
            # Later calls need the secret too, and work with it.
            r = await c.post("/init", json={"envVars": {"A": "1"}}, headers={**INIT, **owner})
            assert r.status_code == 204
            # Reclaim is the host's too (and this agent serves a directory, not a guest).
            assert (await c.post("/reclaim", headers=owner)).status_code == 401
            assert (await c.post("/reclaim", headers=INIT)).status_code == 409
    finally:
        _stop(a)


async def test_sync_is_the_hosts_alone() -> None:
    """/sync (run before a filesystem-only snapshot) takes the init secret, not a token."""
    a = _spawn()
    try:
        async with httpx.AsyncClient(base_url=a.url) as c:
            assert (await c.post("/init", json={"accessToken": "owner"}, headers=INIT)).is_success
            assert (await c.post("/sync")).status_code == 401
            r = await c.post("/sync", headers={"X-Access-Token": "owner"})
            assert r.status_code == 401
            assert (await c.post("/sync", headers=INIT)).status_code == 204
    finally:
        _stop(a)


async def test_init_without_any_secret_is_refused() -> None:
    SECRET_FILE.unlink()
    a = _spawn()
    SECRET_FILE.unlink()  # gone after start: the agent reads it on every /init
    try:
        async with httpx.AsyncClient(base_url=a.url) as c:
            assert (await c.post("/init", json={}, headers=INIT)).status_code == 401
            assert (
                await c.post("/init", json={}, headers={init_secret.HEADER: ""})
            ).status_code == 401
    finally:
        _stop(a)


async def test_rootfs_confines_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nuser:x:1000:\n")
    (root / "data").mkdir()
    (root / "escape").symlink_to("/data")  # absolute: must resolve inside root
    a = _spawn(str(root))
    try:
        async with httpx.AsyncClient(base_url=a.url, headers=INIT) as c:
            raw = {"Content-Type": "application/octet-stream"}
            r = await c.post("/files", params={"path": "/escape/f.txt"}, content=b"in", headers=raw)
            assert r.json()[0]["path"] == "/escape/f.txt"
            assert (root / "data" / "f.txt").read_bytes() == b"in"
            assert (root / "data" / "f.txt").stat().st_uid == 1000  # default user is "user"
            r = await c.post("/files", params={"path": "../../x.txt"}, content=b"x", headers=raw)
            assert (root / "x.txt").exists()
            st = (await rpc(c, "/filesystem.Filesystem/Stat", {"path": "/escape/f.txt"})).json()
            assert st["entry"]["owner"] == "user"
    finally:
        _stop(a)


async def test_bash_falls_back_to_the_images_sh(tmp_path: Path) -> None:
    """A busybox root has no bash: what E2B's clients send (`/bin/bash -l -c`) runs in its
    `/bin/sh`; a root that has bash keeps it."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    a = _spawn(str(root))
    try:
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as c:
            login = {"cmd": "/bin/bash", "args": ["-l", "-c", "echo from-$0"]}
            out, _, end, _ = await run(c, {"process": login, "stdin": False}, ROOT)
            assert end == {"exited": True, "status": "exit status 0"}, end
            assert out.decode() == "from-/bin/sh\n"
    finally:
        _stop(a)
