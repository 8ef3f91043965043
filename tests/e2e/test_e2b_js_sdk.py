"""The unmodified `e2b` TypeScript SDK (npm, run by Node) against a live server.

Each scenario of `js/sdk_scenarios.mjs` runs in its own `node` process, configured only by
the environment variables the SDK reads, and prints one JSON line with what it observed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable

import pytest

from ..live import TEST_KEY, LiveServer
from .conftest import JS_DIR

pytestmark = pytest.mark.vm

SCENARIO_TIMEOUT = 180
# What the `codeInterpreter` scenario observes on any server that built the template.
CODE_INTERPRETER_RESULTS = {
    "sum": "2",
    "stdout": "streamed\n",
    "results": ["42"],
    "kept": "41",
    "js": "42",
    "cwd": "/tmp",
    "error": "ZeroDivisionError",
}


def run_scenario(node: str, server: LiveServer, scenario: str) -> dict:
    return run_scenario_at(node, server.url, TEST_KEY, scenario, server.log_tail)


def run_scenario_at(
    node: str, url: str, api_key: str, scenario: str, server_log: Callable[[], str]
) -> dict:
    """Run one scenario with the SDK pointed at `url`; the results it printed."""
    env = {**os.environ, "E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": api_key}
    env.pop("E2B_DEBUG", None)
    env.pop("E2B_DOMAIN", None)
    try:
        done = subprocess.run(
            [node, "sdk_scenarios.mjs", scenario],
            cwd=JS_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{scenario} did not finish in {SCENARIO_TIMEOUT}s; stderr:\n{exc.stderr}")
    assert done.returncode == 0, (
        f"{scenario} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        f"\nserver log:\n{server_log()}"
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"{scenario} printed nothing; stderr:\n{done.stderr}"
    report = json.loads(lines[-1])
    assert report["scenario"] == scenario
    assert report["ok"] is True
    return report["results"]


def check_commands(r: dict) -> None:
    assert r["basic"] == {"stdout": "hi\n", "stderr": "oops\n", "exitCode": 0}
    assert r["exitError"] == {"exitCode": 4, "stdout": "partial\n"}
    assert (r["envs"], r["cwd"]) == ("yes 1\n", "/tmp\n")
    assert (r["root"], r["defaultUser"]) == ("root\n", "user\n")
    assert r["bigLength"] == 1048576
    assert r["timeout"]["name"] == "TimeoutError"
    assert "".join(r["chunks"]) == "1\n2\n3\n"
    assert "".join(r["stderrChunks"]) == "e1\ne2\n"


def check_background(r: dict) -> None:
    assert (r["listed"], r["killMissing"], r["handleKill"]) == (True, False, True)
    assert (r["stdin"], r["closeStdin"]) == ("got ping\n", "abc\ndone\n")
    assert r["connected"] == "tick\n"
    assert r["missingPidErrors"] is True


def check_pty(r: dict) -> None:
    assert (r["sawNewSize"], r["exitCode"], r["ptyKill"]) == (True, 0, True)


def check_files(r: dict) -> None:
    assert r["writePath"] == "/home/user/notes/hello.txt"
    assert r["bytes"] == [0, 1, 255]
    assert r["otherFormats"] is True
    assert r["listed"] == ["a.txt", "b.txt"]
    assert r["getInfo"] == {"name": "a.txt", "size": 1, "type": "file"}
    assert "new.txt" in r["watched"]
    assert r["missingPathErrors"] is True


def check_lifecycle(r: dict) -> None:
    assert [s["id"] for s in r["listedRunning"]] == [r["sandboxId"]]
    assert r["info"]["state"] == "running"
    assert r["info"]["metadata"]["sdk"] == "js"
    assert 60 < r["timeoutRemaining"] <= 130
    assert r["listedPaused"] == ["paused"]
    assert r["resumed"] == "resumed\nbefore\n"
    assert r["killed"] is True


def check_not_found(r: dict) -> None:
    # SandboxNotFoundError is the SDK's NotFoundError subclass for sandboxes.
    assert r["connectError"] == r["getInfoError"] == "SandboxNotFoundError"
    assert r["killMissing"] is False
    assert r["badTemplateError"]


def check_network(r: dict) -> None:
    rule = [{"transform": {"headers": {"X-Key": "literal"}}}]
    created = r["created"]
    assert created["allowOut"] == ["192.0.2.10", "api.site.test"]
    assert created["rules"] == {"api.site.test": rule}
    assert created["egressProxy"] == {"address": "198.51.100.1:1080", "username": "u"}
    assert created["httpsPorts"] == [3000]
    updated = r["updated"]
    assert updated["allowOut"] == ["192.0.2.11"] and updated["rules"] == {"*.site.test": rule}
    # An update replaces the egress settings whole: the proxy is gone; the ports stay.
    assert "egressProxy" not in updated and updated["httpsPorts"] == [3000]


CHECKS = {
    "commands": check_commands,
    "background": check_background,
    "pty": check_pty,
    "files": check_files,
    "lifecycle": check_lifecycle,
    "not_found": check_not_found,
    "network": check_network,
}


@pytest.mark.parametrize("scenario", list(CHECKS))
def test_js_sdk(scenario: str, node_sdk: str, server: LiveServer) -> None:
    CHECKS[scenario](run_scenario(node_sdk, server, scenario))


def test_the_e2b_cli_works_against_the_server(node_sdk: str, server: LiveServer) -> None:
    """`@e2b/cli` from npm, unmodified: templates and sandboxes listed, exec, pause,
    resume, logs, kill."""
    env = {**os.environ, "E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url}
    env["E2B_API_KEY"] = TEST_KEY
    env.pop("E2B_DOMAIN", None)

    def e2b(*args: str) -> str:
        done = subprocess.run(
            [node_sdk, str(JS_DIR / "node_modules" / "@e2b" / "cli" / "dist" / "index.js"), *args],
            env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    assert "base" in e2b("template", "list")
    with server.client() as api:
        sandbox_id = api.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
    try:
        assert sandbox_id in e2b("sandbox", "list")
        assert "State: running" in e2b("sandbox", "info", sandbox_id)
        assert e2b("sandbox", "exec", sandbox_id, "echo", "from the e2b cli").strip() == (
            "from the e2b cli"
        )
        e2b("sandbox", "pause", sandbox_id)
        assert "Paused" in e2b("sandbox", "list", "--state", "paused")
        e2b("sandbox", "resume", sandbox_id)
        assert "Running" in e2b("sandbox", "list")
        # The guest's log, across the pause: the exec's process, started and ended.
        logs = e2b("sandbox", "logs", sandbox_id, "--format", "json")
        assert "from the e2b cli" in logs and "process ended" in logs
    finally:
        e2b("sandbox", "kill", sandbox_id)
    assert sandbox_id not in e2b("sandbox", "list")


@pytest.mark.slow
def test_js_code_interpreter_sdk(node_sdk: str, code_interpreter_server: LiveServer) -> None:
    """`@e2b/code-interpreter`, unmodified, on the server that built `code-interpreter-v1`."""
    results = run_scenario(node_sdk, code_interpreter_server, "codeInterpreter")
    assert results == CODE_INTERPRETER_RESULTS
