"""Schemathesis over the live server's `/openapi.json`: whatever it sends, never a 5xx, and
every answer is one the schema documents.

Nothing may leave this machine: the routes that pull images are left out (a create never
pulls: `registry.pull_on_create` is off).
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def api_schema(server: LiveServer) -> schemathesis.BaseSchema:
    """The session's server's schema; the VM factory kills what the fuzzing creates."""
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path=PULLING)


@schema.parametrize()
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_input_gets_a_server_error(case: schemathesis.Case, server: LiveServer) -> None:
    # Generous for a machine shared with the suite's other worker (`POST /gc` may wait 5 s
    # for an upload's lease); a hung request still fails.
    case.call_and_validate(
        base_url=server.url, headers={"X-API-Key": TEST_KEY}, checks=CHECKS, timeout=60
    )
