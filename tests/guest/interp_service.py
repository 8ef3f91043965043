"""The execution service as the template runs it: the package copied alone as
``aenv_interpreter`` and started with ``python -m aenv_interpreter`` on a free loopback port,
with the venv's kernels (bash's spec installed in a directory of the test's) and a fake
guest agent that serves ``/envs``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from aiohttp import web
from e2b import ConnectionConfig
from e2b_code_interpreter import Sandbox
from packaging.version import Version

import agentenv.guest.interpreter

PACKAGE = Path(agentenv.guest.interpreter.__file__).parent
TOKEN = "test-access-token"
# Deno's kernel, when the host has deno (on PATH, or AENV_TEST_DENO names the binary).
DENO = os.environ.get("AENV_TEST_DENO") or shutil.which("deno")
SANDBOX_ENVS = {"SANDBOX_VAR": "from-agent", "SHARED": "sandbox"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeAgent:
    """``GET /envs`` as the guest agent answers it, for the right access token only."""

    url: str = ""
    tokens: list[str | None] = field(default_factory=list)

    async def envs(self, request: web.Request) -> web.Response:
        token = request.headers.get("X-Access-Token")
        self.tokens.append(token)
        if token != TOKEN:
            return web.json_response({"code": 401, "message": "bad token"}, status=401)
        return web.json_response(SANDBOX_ENVS)


@contextmanager
def fake_agent() -> Iterator[FakeAgent]:
    agent = FakeAgent()
    loop = asyncio.new_event_loop()
    port = free_port()
    app = web.Application()
    app.router.add_get("/envs", agent.envs)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    agent.url = f"http://127.0.0.1:{port}"
    try:
        yield agent
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def install_layout(root: Path) -> tuple[Path, Path]:
    """The package as /opt/aenv/aenv_interpreter, and a Jupyter data dir with bash's spec
    (and deno's, as the template writes it, if there is a deno)."""
    opt = root / "opt"
    shutil.copytree(PACKAGE, opt / "aenv_interpreter", ignore=shutil.ignore_patterns("__pycache__"))
    jupyter = root / "jupyter"
    subprocess.run(
        [sys.executable, "-m", "bash_kernel.install", "--prefix", str(jupyter)],
        check=True,
        capture_output=True,
    )
    data = jupyter / "share" / "jupyter"
    if DENO:
        spec = {
            "argv": [DENO, "jupyter", "--kernel", "--conn", "{connection_file}"],
            "display_name": "Deno",
            "language": "typescript",
            "env": {"NO_COLOR": "1"},
        }
        (data / "kernels" / "deno").mkdir(parents=True)
        (data / "kernels" / "deno" / "kernel.json").write_text(json.dumps(spec))
    return opt, data


@dataclass
class Service:
    url: str
    proc: subprocess.Popen[bytes]
    cwd: Path
    started_at: float
    ready_at: float = 0.0

    def sandbox(self, token: str | None = TOKEN) -> Sandbox:
        """The SDK's Sandbox pointed at this service, as Sandbox.connect would build it."""
        config = ConnectionConfig(debug=True, sandbox_url=self.url, api_key="e2b_test")
        return Sandbox(
            sandbox_id="debug_sandbox_id",
            sandbox_domain=None,
            envd_version=Version("0.6.4"),
            envd_access_token=token,
            traffic_access_token=None,
            connection_config=config,
        )

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    self.ready_at = time.monotonic()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("the service never became healthy")

    def server_pid(self) -> int:
        """The supervised server: the supervisor's child."""
        pid = self.server_pid_or_none()
        assert pid is not None
        return pid

    def server_pid_or_none(self) -> int | None:
        pids = children(self.proc.pid)
        return pids[0] if len(pids) == 1 else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def children(ppid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == ppid:
                found.append(int(entry))
    return found


@contextmanager
def running_service(root: Path, agent: FakeAgent) -> Iterator[Service]:
    opt, jupyter_path = install_layout(root)
    cwd = root / "home"
    cwd.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(opt),
        "JUPYTER_PATH": str(jupyter_path),
        "AENV_AGENT_URL": agent.url,
        "AENV_INTERPRETER_CWD": str(cwd),
    }
    log = (root / "service.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aenv_interpreter", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    service = Service(f"http://127.0.0.1:{port}", proc, cwd, started)
    try:
        service.wait_healthy()
        yield service
    finally:
        service.stop()
        log.close()
