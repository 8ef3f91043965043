"""Control-plane commands against an httpx.MockTransport: ls, rm, timeout, info, start, errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

API_KEY = "e2b_test"


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def listed(sandbox_id: str, **extra: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "sandboxID": sandbox_id,
        "templateID": "base",
        "clientID": "x",
        "state": "running",
        "startedAt": (now - timedelta(minutes=5)).isoformat().replace("+00:00", "Z"),
        "endAt": (now + timedelta(minutes=3, seconds=30)).isoformat().replace("+00:00", "Z"),
        "cpuCount": 1,
        "memoryMB": 512,
        "diskSizeMB": 4096,
        "envdVersion": "0.5.7",
        "metadata": {},
        **extra,
    }


def paged_handler(pages: list[list[dict[str, Any]]]) -> Any:
    """Serve `pages` in order, linking them with x-next-token `t1`, `t2`, …"""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v2/sandboxes"
        assert request.headers["x-api-key"] == API_KEY
        token = request.url.params.get("nextToken")
        index = int(token[1:]) if token else 0
        headers = {"x-next-token": f"t{index + 1}"} if index + 1 < len(pages) else {}
        return json_response(200, pages[index], headers)

    return handler


def test_ls_json_when_piped_follows_pagination(cli: Any) -> None:
    pages = [[listed("a1"), listed("a2")], [listed("b1")], [listed("c1", state="paused")]]
    run = cli(["ls"], paged_handler(pages))
    assert run.code == 0, run.stderr
    assert [s["sandboxID"] for s in json.loads(run.stdout)] == ["a1", "a2", "b1", "c1"]
    tokens = [r.url.params.get("nextToken") for r in run.requests]
    assert tokens == [None, "t1", "t2"]


def test_ls_table_on_tty(cli: Any) -> None:
    first = {**listed("sbx1", metadata={"team": "ml"}), "node": "n1", "hostMemoryMB": 41}
    pages = [[first, listed("sbx2", alias="py", state="paused")]]
    run = cli(["ls"], paged_handler(pages), tty=True)
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    header = ["SANDBOX", "ID", "TEMPLATE", "STATE", "NODE", "MEMORY", "STARTED", "ENDS"]
    assert lines[0].split() == [*header, "METADATA"]
    row = ["sbx1", "base", "running", "n1", "41/512M", "5m", "ago", "in", "3m", "team=ml"]
    assert lines[1].split() == row
    assert lines[2].split()[:3] == ["sbx2", "py", "paused"]
    # Columns line up under their headers.
    assert lines[1].index("running") == lines[0].index("STATE")


def test_ls_output_flag_overrides_tty(cli: Any) -> None:
    run = cli(["ls", "--output", "json"], paged_handler([[listed("x")]]), tty=True)
    assert json.loads(run.stdout)[0]["sandboxID"] == "x"
    run = cli(["ls", "-o", "table"], paged_handler([[]]))
    assert run.stdout.split() == [
        "SANDBOX",
        "ID",
        "TEMPLATE",
        "STATE",
        "NODE",
        "MEMORY",
        "STARTED",
        "ENDS",
        "METADATA",
    ]


def test_ls_filters(cli: Any) -> None:
    run = cli(
        ["ls", "--state", "running,paused", "--metadata", "k=v 1", "--metadata", "x&y=a=b"],
        paged_handler([[]]),
    )
    assert run.code == 0
    params = run.requests[0].url.params
    assert params["state"] == "running,paused"
    # The server undoes the SDK's encoding: parse the value as a query, then unquote each part.
    decoded = {k: v[0] for k, v in parse_qs(params["metadata"]).items()}
    assert {
        k.replace("%26", "&"): v.replace("%20", " ").replace("%3D", "=") for k, v in decoded.items()
    } == {
        "k": "v 1",
        "x&y": "a=b",
    }


def test_ls_bad_state_is_usage_error(cli: Any) -> None:
    run = cli(["ls", "--state", "dead"], paged_handler([[]]))
    assert run.code == 2
    assert "unknown state" in run.stderr
    assert run.requests == []


def test_rm_tries_all_and_reports_404(cli: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "DELETE"
        sandbox_id = request.url.path.rsplit("/", 1)[1]
        if sandbox_id == "missing":
            return json_response(404, {"code": 404, "message": "sandbox missing not found"})
        return httpx.Response(204)

    run = cli(["rm", "a", "missing", "b"], handler)
    assert run.code == 1
    assert run.stdout.split() == ["a", "b"]
    assert "error: missing: sandbox missing not found" in run.stderr
    assert [r.url.path for r in run.requests] == [
        "/sandboxes/a",
        "/sandboxes/missing",
        "/sandboxes/b",
    ]


def test_api_error_json_becomes_message_and_exit_1(cli: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return json_response(404, {"code": 404, "message": "sandbox nope not found"})

    run = cli(["info", "nope"], handler)
    assert run.code == 1
    assert run.stderr == "error: sandbox nope not found\n"
    assert run.stdout == ""


def test_unauthorized_adds_hint(cli: Any) -> None:
    run = cli(["ls"], lambda r: json_response(401, {"code": 401, "message": "invalid API key"}))
    assert run.code == 1
    assert "invalid API key" in run.stderr and "aenv auth" in run.stderr


def test_non_json_error_body(cli: Any) -> None:
    run = cli(["info", "x"], lambda r: httpx.Response(502, text="Bad Gateway"))
    assert run.code == 1
    assert run.stderr.startswith("error: HTTP 502: Bad Gateway")


def test_connection_refused_hint(cli: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    run = cli(["ls"], handler)
    assert run.code == 1
    assert "is the server running? make run" in run.stderr


def test_timeout_and_info(cli: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            assert request.url.path == "/sandboxes/s1/timeout"
            assert json.loads(request.content) == {"timeout": 600}
            return httpx.Response(204)
        return json_response(200, listed("s1", envdAccessToken="tok"))

    assert cli(["timeout", "s1", "600"], handler).code == 0
    run = cli(["info", "s1"], handler)
    assert run.code == 0
    assert json.loads(run.stdout)["envdAccessToken"] == "tok"
    assert run.stdout.startswith("{\n  ")


def test_start_detach_sends_body_and_prints_id(cli: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/sandboxes")
        assert request.headers["x-api-key"] == API_KEY
        return json_response(201, {"sandboxID": "new1", "templateID": "py", "envdVersion": "0.5.7"})

    argv = ["start", "py", "-d", "--timeout", "60", "--env", "A=1", "--metadata", "k=v"]
    run = cli([*argv, "--no-internet", "--secure", "--pause-after-idle", "120"], handler)
    assert run.code == 0, run.stderr
    assert run.stdout == "new1\n"
    assert json.loads(run.requests[0].content) == {
        "templateID": "py",
        "timeout": 60,
        "envVars": {"A": "1"},
        "metadata": {"k": "v"},
        "allow_internet_access": False,
        "secure": True,
        "pauseAfterIdle": 120,
    }


def test_start_minimal_body(cli: Any) -> None:
    run = cli(["start", "--detach"], lambda r: json_response(201, {"sandboxID": "s"}))
    assert json.loads(run.requests[0].content) == {
        "templateID": "base",
        "envVars": {},
        "metadata": {},
    }


def test_start_bad_pair_is_usage_error(cli: Any) -> None:
    run = cli(["start", "-d", "--env", "NOEQUALS"], lambda r: httpx.Response(500))
    assert run.code == 2
    assert "KEY=VALUE" in run.stderr
    assert run.requests == []


def test_base_url_path_prefix_is_kept(cli: Any, monkeypatch: Any) -> None:
    from agentenv.cli.client import ApiClient

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(204)

    with ApiClient("http://h/api/", "k", transport=httpx.MockTransport(handler)) as api:
        api.kill_sandbox("a/b")
    assert urlsplit(seen[0]).path == "/api/sandboxes/a%2Fb"
