"""Bad input against the live server: a clear 4xx each, and nothing stored or changed."""

from __future__ import annotations

import base64
import http.client
import json
import time
from urllib.parse import urlsplit

import pytest

from agentenv.api.limits import MAX_ENTRIES, MAX_VALUE_BYTES

from ..live import TEST_KEY, LiveServer

pytestmark = pytest.mark.vm

JSON = {"Content-Type": "application/json"}


def raw_request(server: LiveServer, method: str, path: str, headers: dict, body: bytes = b""):
    """One request with headers exactly as given (httpx would refuse non-ASCII bytes)."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"templateID": "ba\x00se"}, "templateID"),
        ({"templateID": "base", "metadata": {str(i): "x" for i in range(MAX_ENTRIES + 1)}},
         "at most 64 entries"),
        ({"templateID": "base", "metadata": {"k": "v" * (MAX_VALUE_BYTES + 1)}}, "at most 4096"),
        ({"templateID": "base", "envVars": {"": "v"}}, "keys must be"),
        ({"templateID": "base", "envVars": {"A": "a\x00b"}}, "NUL"),
        ({"templateID": "base", "envVars": {"A=B": "c"}}, "may not contain '='"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("create", ["/v2/sandboxes", "/sandboxes"])
def test_bad_bodies_are_400(server: LiveServer, create: str, body: dict, text: str) -> None:
    with server.client() as api:
        response = api.post(create, json=body)
        assert response.status_code == 400, response.text
        assert text in response.json()["message"]
        assert api.get("/v2/sandboxes").json() == []


def test_a_lone_surrogate_is_400(server: LiveServer) -> None:
    with server.client() as api:
        body = b'{"templateID": "base", "metadata": {"k": "\\ud800"}}'
        assert api.post("/v2/sandboxes", content=body, headers=JSON).status_code == 400


def test_oversized_bodies_are_413_before_parsing(server: LiveServer) -> None:
    """50 MB, declared or chunked: refused once the limit is read, and the loop stays free."""
    huge = b'{"templateID": "base", "metadata": {"a": "' + b"a" * 50_000_000 + b'"}}'
    with server.client() as api:
        response = api.post("/v2/sandboxes", content=huge, headers=JSON)
        assert (response.status_code, response.json()["code"]) == (413, 413)

        def chunks():
            for start in range(0, len(huge), 1 << 20):
                yield huge[start : start + (1 << 20)]

        response = api.post("/v2/sandboxes", content=chunks(), headers=JSON)
        assert response.status_code == 413
        # A body of many small keys never reaches the parser either.
        many = json.dumps(
            {"templateID": "base", "metadata": {str(i): "" for i in range(2_000_000)}}
        )
        started = time.monotonic()
        assert api.post("/v2/sandboxes", content=many, headers=JSON).status_code == 413
        assert api.get("/health").status_code == 200
        assert time.monotonic() - started < 5
        assert api.get("/v2/sandboxes").json() == []


def test_a_next_token_without_timezone_is_400(server: LiveServer) -> None:
    token = base64.urlsafe_b64encode(b"2026-01-01T00:00:00|iabc").decode()
    with server.client() as api:
        response = api.get("/v2/sandboxes", params={"nextToken": token})
        assert response.status_code == 400
        assert "timezone" in response.json()["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {"E2b-Sandbox-Id": b"\xff\xfe"},
        {"E2b-Sandbox-Id": b"iabc", "E2b-Sandbox-Port": b"\xff"},
    ],
)
def test_non_ascii_routing_headers_are_400(server: LiveServer, headers: dict) -> None:
    status, body = raw_request(server, "GET", "/health", {"X-API-Key": TEST_KEY, **headers})
    assert (status, body["code"]) == (400, 400)


@pytest.mark.parametrize("template_id", ["%00x", "x%0A", "..%2Fsecrets", "A" * 70])
def test_odd_template_ids_are_404(server: LiveServer, template_id: str) -> None:
    status, body = raw_request(server, "GET", f"/templates/{template_id}", {"X-API-Key": TEST_KEY})
    assert (status, body["code"]) == (404, 404)


@pytest.mark.parametrize("sandbox_id", ["%00", "%FF%FE", "..%2F..%2Fetc", "i" * 300, "%E2%80%AE"])
@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ""), ("DELETE", ""), ("POST", "/pause"), ("GET", "/metrics"), ("POST", "/connect")],
)
def test_odd_sandbox_ids_are_404(
    server: LiveServer, sandbox_id: str, method: str, suffix: str
) -> None:
    path = f"/sandboxes/{sandbox_id}{suffix}"
    status, body = raw_request(server, method, path, {"X-API-Key": TEST_KEY})
    assert (status, body["code"]) == (404, 404)


def test_a_wrong_method_is_405_naming_the_allowed_ones(server: LiveServer) -> None:
    with server.client() as api:
        response = api.put("/sandboxes/iabc")
        assert (response.status_code, response.json()["code"]) == (405, 405)
        assert "GET" in response.headers["allow"]
