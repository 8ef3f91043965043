"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from agentenv.config import load_config

from ..browser import chromium
from ..live import LiveServer, checked_server, point_sdk

JS_DIR = Path(__file__).with_name("js")
# The built-in template's build on a fresh server: minutes under TCG (docs/code-interpreter.md).
TEMPLATE_BUILD_TIMEOUT = 1800.0


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, for the console's tests (`tests/browser.py`). One per
    test: Playwright's sync API runs an event loop in this thread while it is open, and
    later tests of a module call `asyncio.run`."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def e2b_env(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the unmodified E2B SDK at the live server with its three variables only."""
    point_sdk(monkeypatch, server.url)


@pytest.fixture(scope="session")
def code_interpreter_server(
    kit_ready: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """The one server of the session that builds `code-interpreter-v1` (it takes minutes),
    shared by every code interpreter test; its image comes from `aenv kit build`."""
    from agentenv.images.codeinterpreter import build_code_interpreter

    build_code_interpreter(load_config())
    live = LiveServer(
        tmp_path_factory.mktemp("aenv-ci-home"),
        extra_env={"AENV_SERVER_CODE_INTERPRETER": "true"},
    )
    with checked_server(live, wait_for_code_interpreter) as ready:
        yield ready


def wait_for_code_interpreter(live: LiveServer) -> None:
    """Until the server's claim on the built-in template says it is built."""
    claim_file = live.home / "objects" / "builtin" / "code-interpreter-v1.json"
    deadline = time.monotonic() + TEMPLATE_BUILD_TIMEOUT
    while time.monotonic() < deadline:
        if claim_file.exists():
            claim = json.loads(claim_file.read_text())
            if claim["state"] == "ready":
                return
            if claim["state"] == "failed":
                pytest.fail(f"code-interpreter-v1 failed to build: {claim['reason']}")
        time.sleep(2)
    pytest.fail(f"code-interpreter-v1 was not built in time: {live.log_tail()}")


@pytest.fixture
def code_interpreter_env(
    code_interpreter_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> LiveServer:
    """The E2B SDK's three variables, pointing at the code interpreter's server."""
    point_sdk(monkeypatch, code_interpreter_server.url)
    return code_interpreter_server


@pytest.fixture(scope="module")
def node_sdk() -> str:
    """The `node` binary, with the pinned SDK installed from the lockfile when missing."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("the TypeScript SDK tests need `node` and `npm` on PATH (Node 20 or newer)")
    installed_already = all(
        (JS_DIR / "node_modules" / package / "package.json").exists()
        for package in ("e2b", "@e2b/cli", "@e2b/code-interpreter")
    )
    if not installed_already:
        installed = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=JS_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if installed.returncode != 0:
            pytest.fail(f"npm ci failed in {JS_DIR}:\n{installed.stdout}\n{installed.stderr}")
    return node
