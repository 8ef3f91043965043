"""Template build requests: E2B's `minFreeDiskMb` is bounded and reaches the build's
recipe, which then runs in a build sandbox (where the filesystem grows); `maxCpuCount`
may only repeat `cpuCount`."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from agentenv.api import builds
from agentenv.api.errors import install_error_handlers
from agentenv.config import Config
from agentenv.images.builder import TemplateBuilds
from agentenv.images.stepbuild import Recipe


@pytest.fixture
def started() -> list[Recipe]:
    return []


@pytest.fixture
def api(started: list[Recipe]) -> Iterator[tuple[TestClient, TemplateBuilds]]:
    service = TemplateBuilds(Config(), catalog=None, puller=None, max_vcpus=4, files=None)  # type: ignore[arg-type]

    def from_steps(build: Any, recipe: Recipe, image: Any, credentials: Any) -> None:
        started.append(recipe)

    service.from_steps = from_steps  # type: ignore[method-assign]
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(builds.router)
    app.state.node = SimpleNamespace(builds=service, catalog=None)
    app.state.config = Config()
    with TestClient(app) as client:
        yield client, service


@pytest.mark.parametrize("size", [-1, 32769, 10**9])
def test_a_free_disk_size_out_of_bounds_is_refused(
    api: tuple[TestClient, TemplateBuilds], size: int
) -> None:
    client, _ = api
    answer = client.post("/v3/templates", json={"name": "big", "minFreeDiskMb": size})
    assert answer.status_code == 400
    assert answer.json()["message"].startswith("invalid request: minFreeDiskMb: Input should be")


def test_the_free_disk_size_reaches_the_recipe(
    api: tuple[TestClient, TemplateBuilds], started: list[Recipe]
) -> None:
    client, service = api
    answer = client.post("/v3/templates", json={"name": "big", "minFreeDiskMb": 32768})
    assert answer.status_code == 202
    build_id = answer.json()["buildID"]
    assert service.tracker.get("big", build_id).min_free_disk_mb == 32768
    # A copy of a template alone would be a copy; asking for disk makes it a build.
    start = client.post(f"/v2/templates/big/builds/{build_id}", json={"fromTemplate": "other"})
    assert start.status_code == 202
    assert [r.min_free_disk_mb for r in started] == [32768]
    # 0 asks for no growth, as in E2B.
    answer = client.post("/v3/templates", json={"name": "small", "minFreeDiskMb": 0})
    assert service.tracker.get("small", answer.json()["buildID"]).min_free_disk_mb is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"cpuCount": 2, "maxCpuCount": 4}, "resizable templates are not supported"),
        ({"maxCpuCount": 4}, "resizable templates are not supported"),
        ({"cpuCount": 4, "maxCpuCount": 2}, "maxCpuCount (2) must be at least cpuCount (4)"),
    ],
)
def test_a_resizable_template_is_refused_clearly(
    api: tuple[TestClient, TemplateBuilds], body: dict[str, int], message: str
) -> None:
    client, service = api
    answer = client.post("/v3/templates", json={"name": "sized", **body})
    assert answer.status_code == 400 and message in answer.json()["message"], answer.text
    assert service.tracker.of_template("sized") == []


def test_a_max_cpu_count_equal_to_the_cpu_count_is_a_fixed_size(
    api: tuple[TestClient, TemplateBuilds],
) -> None:
    client, service = api
    answer = client.post("/v3/templates", json={"name": "sized", "cpuCount": 2, "maxCpuCount": 2})
    assert answer.status_code == 202, answer.text
    assert service.tracker.get("sized", answer.json()["buildID"]).vcpus == 2
