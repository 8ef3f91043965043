"""The Compose deployment for real: Debian's Docker engine (started here when none runs),
the images built locally (no registry), PostgreSQL, S3, a control plane and two nodes
brought up, and the unmodified E2B SDK running a command through the control plane."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from agentenv.config import load_config

from ..live import free_port

pytestmark = pytest.mark.vm

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "docker" / "docker-compose.yml"


def _engine_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def docker_engine() -> Iterator[None]:
    """The host's engine, or one started for these tests (and stopped after them)."""
    if _engine_up():
        yield
        return
    log = open("/tmp/aenv-test-dockerd.log", "ab")
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        deadline = time.monotonic() + 60
        while not _engine_up():
            assert daemon.poll() is None, "dockerd exited; see /tmp/aenv-test-dockerd.log"
            assert time.monotonic() < deadline, "dockerd did not come up"
            time.sleep(0.5)
        yield
    finally:
        daemon.terminate()
        daemon.wait(60)


@pytest.fixture(scope="module")
def image(docker_engine: None, kit_ready: None) -> str:
    subprocess.run([sys.executable, str(REPO / "deploy/docker/build.py")], check=True, cwd=REPO)
    return "aenv:latest"


def _compose(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_compose_stack_serves_the_e2b_sdk(image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config()
    port = free_port()
    key = "e2b_" + secrets.token_hex(20)
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": "aenvtest" + secrets.token_hex(3),
        "AENV_IMAGE": image,
        "AENV_API_KEY": key,
        "AENV_PORT": str(port),
        # The host's kit and base template: the nodes find them built.
        "AENV_KIT_DIR": str(cfg.kit_dir),
        "AENV_IMAGES_DIR": str(cfg.images_dir),
    }
    url = f"http://127.0.0.1:{port}"
    try:
        _compose(env, "up", "-d")
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).json().get("nodes") == 2:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, _compose(env, "logs", "--tail", "40")
            time.sleep(1)
        for name, value in (("E2B_API_URL", url), ("E2B_SANDBOX_URL", url), ("E2B_API_KEY", key)):
            monkeypatch.setenv(name, value)
        sandbox = Sandbox.create()
        try:
            result = sandbox.commands.run("echo hello from compose; cat /etc/os-release")
            assert result.stdout.startswith("hello from compose\n")
            node = httpx.get(f"{url}/sandboxes/{sandbox.sandbox_id}", headers={"X-API-Key": key})
            assert node.json()["node"] in ("node1", "node2")
        finally:
            sandbox.kill()
    finally:
        _compose(env, "down", "-v", "--remove-orphans")
    project = env["COMPOSE_PROJECT_NAME"]
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name={project}"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
