"""Schemathesis over the live server's `/openapi.json`: whatever it sends, never a 5xx.

Nothing may leave this machine: the routes that pull images are left out, and image
references in `templateID` (which a create would pull) become unknown template names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from ..live import TEST_KEY, LiveServer

pytestmark = pytest.mark.vm

# Pulls reach registries; everything else is fuzzed.
PULLING = ["/templates/pull", "/v2/templates/{template_id}/builds/{build_id}"]


@pytest.fixture(scope="module")
def fuzzed_server(
    kit_ready: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    live = LiveServer(Path(tmp_path_factory.mktemp("fuzz-home")))
    live.start()
    try:
        yield live
    finally:
        live.close()


@pytest.fixture(scope="module")
def api_schema(fuzzed_server: LiveServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path=PULLING)


def _offline(case: schemathesis.Case) -> None:
    """A `templateID` that names an image would be pulled: make it a plain name."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("templateID"), str):
        if any(c in body["templateID"] for c in "/:@"):
            body["templateID"] = "fuzz-unknown"


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_input_gets_a_server_error(case: schemathesis.Case, fuzzed_server: LiveServer) -> None:
    _offline(case)
    case.call_and_validate(
        base_url=fuzzed_server.url,
        headers={"X-API-Key": TEST_KEY},
        checks=[not_a_server_error],
    )


def test_fuzzing_left_no_sandbox_behind(fuzzed_server: LiveServer) -> None:
    """Runs after the fuzzing: remove whatever sandboxes it created, and count them."""
    with fuzzed_server.client() as api:
        for sandbox in api.get("/v2/sandboxes").json():
            assert api.delete(f"/sandboxes/{sandbox['sandboxID']}").status_code == 204
    assert fuzzed_server.resources().vmms == 0
