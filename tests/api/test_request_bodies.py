"""Bounds on request bodies and list cursors, checked without a server."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from agentenv.api.errors import install_error_handlers
from agentenv.api.limits import MAX_ENTRIES, MAX_KEY_BYTES, MAX_VALUE_BYTES
from agentenv.api.models import NewSandbox
from agentenv.api.pagination import decode_cursor
from agentenv.api.sandboxes import network_option
from agentenv.errors import InvalidInput


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"templateID": "ba\x00se"}, "templateID"),
        ({"templateID": "base\n"}, "templateID"),
        ({"metadata": {str(i): "" for i in range(MAX_ENTRIES + 1)}}, "at most 64 entries"),
        ({"metadata": {"k" * (MAX_KEY_BYTES + 1): ""}}, "keys must be 1 to 256 bytes"),
        # Bytes, not characters: 2049 two-byte characters are 4098 bytes.
        ({"metadata": {"k": "é" * (MAX_VALUE_BYTES // 2 + 1)}}, "at most 4096 bytes"),
        ({"metadata": {"k": "\ud800"}}, "not valid UTF-8"),
        ({"envVars": {"": "v"}}, "keys must be"),
        ({"envVars": {"A": "a\x00b"}}, "NUL"),
        ({"envVars": {"A=B": "c"}}, "may not contain '='"),
    ],
)
def test_bad_create_bodies_are_refused(fields: dict[str, Any], text: str) -> None:
    with pytest.raises(ValidationError, match=text):
        NewSandbox(**{"templateID": "base", **fields})


def test_bodies_at_the_bounds_are_accepted() -> None:
    entries = {f"{i:0{MAX_KEY_BYTES}d}": "v" * MAX_VALUE_BYTES for i in range(MAX_ENTRIES)}
    body = NewSandbox(templateID="base", metadata=entries, envVars={"A": "x=y"})
    assert len(body.metadata) == MAX_ENTRIES


def test_the_schema_states_the_bounds() -> None:
    """So clients and the fuzzer send what the server takes."""
    properties = NewSandbox.model_json_schema()["properties"]
    for field in ("metadata", "envVars"):
        assert properties[field]["maxProperties"] == MAX_ENTRIES
        assert properties[field]["propertyNames"]["maxLength"] == MAX_KEY_BYTES
        assert properties[field]["additionalProperties"]["maxLength"] == MAX_VALUE_BYTES
    assert "=" in properties["envVars"]["propertyNames"]["pattern"]


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"2026-01-01T00:00:00|iabc", "no timezone"),
        (b"not a time|iabc", "invalid nextToken"),
        (b"no separator", "invalid nextToken"),
        (b"\xff\xfe|iabc", "invalid nextToken"),
    ],
)
def test_bad_cursors_are_invalid_input(raw: bytes, text: str) -> None:
    with pytest.raises(InvalidInput, match=text):
        decode_cursor(base64.urlsafe_b64encode(raw).decode())
    with pytest.raises(InvalidInput):
        decode_cursor("%%%")


def test_a_cursor_of_ours_reads_back() -> None:
    token = base64.urlsafe_b64encode(b"2026-01-01T00:00:00+00:00|iabc").decode()
    when, sandbox_id = decode_cursor(token)
    assert (when.year, when.tzinfo is not None, sandbox_id) == (2026, True, "iabc")


def test_empty_settings_as_an_sdk_may_send_them_ask_for_nothing() -> None:
    empty = NewSandbox(templateID="base", network={"rules": {}, "egressProxy": None})
    assert network_option(empty.network, True) == {"rules": {}}


def test_every_network_field_of_e2bs_is_taken() -> None:
    network = {
        "allowPublicTraffic": None,
        "allowOut": ["api.example.test"],
        "denyOut": ["0.0.0.0/0"],
        "dnsServers": ["192.0.2.53"],
        "maskRequestHost": "${PORT}.example.test",
        "httpsPorts": [3000, 8443],
        "egressProxy": {
            "address": "proxy.example.test:1080",
            "username": "u",
            "password": "p",
            "tls": {"enabled": True, "serverName": "proxy.example.test", "caCert": "PEM"},
        },
    }
    body = NewSandbox(templateID="base", network=network)
    stored = network_option(body.network, True)
    assert stored == {k: v for k, v in network.items() if v is not None}
    # Rules' keys are kept lower-cased.
    rule = [{"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.key}"}}}]
    body = NewSandbox(templateID="base", network={"rules": {"API.Example.test": rule}})
    assert network_option(body.network, True) == {"rules": {"api.example.test": rule}}


def _validating_app() -> FastAPI:
    """A create route that checks its body as the API does, and creates nothing."""
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v2/sandboxes")
    async def create(body: NewSandbox) -> dict[str, Any]:
        return network_option(body.network, body.allow_internet_access)

    return app


@pytest.mark.parametrize(
    ("network", "text"),
    [
        ({"dnsServers": ["dns.example.test"]}, "network.dnsServers: .*IPv4 address"),
        ({"dnsServers": ["192.0.2.1"] * 11}, "dnsServers: List should have at most 10"),
        ({"httpsPorts": [49983]}, "network.httpsPorts: the agent's port 49983"),
        ({"httpsPorts": [0]}, "network.httpsPorts: ports are 1 to 65535"),
        ({"egressProxy": {"address": "proxy.test:1080", "tls": {"enabled": False,
          "serverName": "p.test"}}}, "with enabled false, no other field"),
        ({"egressProxy": {"address": "proxy.test:1080", "password": "p" * 256}}, "255 bytes"),
        ({"egressProxy": {"address": "proxy.test:0"}}, "ports are 1 to 65535"),
        ({"egressProxy": {"address": "300.1.2.3:1080"}}, "a name or an IPv4 address"),
        ({"egressProxy": {"address": "proxy.test"}}, "egressProxy.address: String should match"),
        ({"rules": {"a.test": [{"transform": {"headers": {"Bad Name": "v"}}}]}},
         "not a header name"),
        ({"rules": {"a.test": [{"transform": {"headers": {"X": "a\r\nHost: b"}}}]}},
         "line break"),
        ({"rules": {"a.test": [{"transform": {"body": "x"}}]}}, "transform.body: Extra inputs"),
        ({"dnsServer": ["192.0.2.1"]}, "network.dnsServer: Extra inputs are not permitted"),
    ],
)  # fmt: skip
def test_bad_network_settings_are_named(network: dict, text: str) -> None:
    client = TestClient(_validating_app())
    answer = client.post("/v2/sandboxes", json={"templateID": "base", "network": network})
    assert answer.status_code == 400
    assert re.search(text, answer.json()["message"]), answer.json()
