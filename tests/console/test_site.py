"""The console's page and assets: gzipped when accepted, under a policy of our own
scripts only; a clear 503 when they were never built; its stream behind the API key."""

from __future__ import annotations

import gzip
import json
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi import APIRouter, Depends, FastAPI
from fastapi.testclient import TestClient

from agentenv.api.auth import ApiKeyAuth
from agentenv.api.console import EVENTS, METRICS, console_router
from agentenv.api.errors import install_error_handlers
from agentenv.console import site

KEY = "e2b_" + "7" * 40


@pytest.fixture
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    page = b"<!doctype html><title>console</title>"
    (tmp_path / "index.html").write_bytes(page)
    (tmp_path / "index.html.gz").write_bytes(gzip.compress(page))
    (tmp_path / "app.js").write_bytes(b"console.log(1)")
    (tmp_path / "app.js.gz").write_bytes(gzip.compress(b"console.log(1)"))
    monkeypatch.setattr(site, "ASSETS", tmp_path)
    return tmp_path


class OneSandbox:
    async def versions(self) -> Mapping[str, Hashable]:
        return {"s1": 1}

    async def rows(self, ids: list[str]) -> list[dict[str, Any]]:
        return [{"sandboxID": i} for i in ids]


async def no_metrics(_: object) -> dict[str, Any]:
    return {"operations": {}, "density": []}


def app() -> FastAPI:
    api = FastAPI()
    install_error_handlers(api)
    protected = APIRouter(dependencies=[Depends(ApiKeyAuth(KEY))])
    protected.include_router(console_router(lambda _: OneSandbox(), no_metrics))  # type: ignore[arg-type,return-value]
    api.include_router(protected)
    api.include_router(site.site_router())
    return api


def test_the_page_comes_gzipped_under_the_policy(assets: Path) -> None:
    client = TestClient(app())
    answer = client.get("/console", follow_redirects=True)
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.text.startswith("<!doctype html>")
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    plain = client.get("/console/assets/app.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert plain.headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize("name", ["..%2F..%2Fetc%2Fpasswd", "app.js.gz", "index.html", "x.py"])
def test_nothing_but_built_scripts_and_styles_is_served_as_an_asset(
    assets: Path, name: str
) -> None:
    answer = TestClient(app()).get(f"/console/assets/{name}")
    assert answer.status_code == 404
    assert answer.json()["code"] == 404


def test_an_unbuilt_console_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(site, "ASSETS", tmp_path / "none")
    answer = TestClient(app()).get("/console/")
    assert answer.status_code == 503
    assert "make console" in answer.json()["message"]


def test_the_consoles_routes_need_the_key() -> None:
    client = TestClient(app())
    assert client.get(EVENTS).status_code == 401
    assert client.get(METRICS).status_code == 401
    assert client.get(METRICS, headers={"X-API-Key": KEY}).json()["density"] == []
    with client.stream("GET", EVENTS, headers={"X-API-Key": KEY}) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        first = next(answer.iter_lines())
        assert first == "event: snapshot"


def test_the_built_console_weighs_under_its_budget() -> None:
    """At most 300 KB gzipped for the page and everything it loads (`make console`)."""
    sizes = site.ASSETS / "sizes.json"
    if not sizes.is_file():
        pytest.skip("the console is not built here (`make console`; `make test` builds it)")
    built = json.loads(sizes.read_text())
    assert set(built) == {"index.html", "app.js", "app.css"}
    assert sum(entry["gzipped"] for entry in built.values()) <= 300 * 1024
