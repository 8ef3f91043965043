"""Schemathesis over the live server's `/openapi.json`: whatever it sends, never a 5xx, and
every answer is one the schema documents.

Nothing may leave this machine: the routes that pull images are left out, and image
references in `templateID` (which a create would pull) become unknown template names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ..live import TEST_KEY, LiveServer

pytestmark = pytest.mark.vm

# Pulls reach registries; everything else is fuzzed.
PULLING = ["/templates/pull", "/v2/templates/{template_id}/builds/{build_id}"]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    ignored_auth,
]


def _sandbox_ids(server: LiveServer) -> set[str]:
    with server.client() as api:
        return {s["sandboxID"] for s in api.get("/v2/sandboxes").json()}


@pytest.fixture(scope="module")
def fuzzed_server(server: LiveServer) -> Iterator[LiveServer]:
    """The session's server; sandboxes the fuzzing created are deleted after it."""
    before = _sandbox_ids(server)
    yield server
    with server.client() as api:
        for sandbox_id in _sandbox_ids(server) - before:
            assert api.delete(f"/sandboxes/{sandbox_id}").status_code == 204


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
        base_url=fuzzed_server.url, headers={"X-API-Key": TEST_KEY}, checks=CHECKS
    )
