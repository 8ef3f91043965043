"""A guest's answer on the server's own origin (the `/proxy/` path, where the console
keeps its key) is sandboxed by policy; on a header or its own host name it is not."""

from __future__ import annotations

from typing import Any

import pytest

from agentenv.proxy.isolation import POLICY

from .test_token_check import through_proxy


def policies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [v for k, v in sent[0]["headers"] if k == b"content-security-policy"]


@pytest.mark.parametrize(
    ("by_header", "headers", "sandboxed"),
    [
        (False, {}, True),
        (False, {b"aenv-addressed-by": b"path"}, True),
        # A control plane's relay of a client that used the header or a host name.
        (False, {b"aenv-addressed-by": b"other"}, False),
        (True, {b"e2b-sandbox-port": b"8080"}, False),
    ],
)
async def test_only_answers_on_the_servers_origin_are_sandboxed(
    by_header: bool, headers: dict[bytes, bytes], sandboxed: bool
) -> None:
    sent: list[dict[str, Any]] = []
    path = b"/page" if by_header else b"/proxy/iabc/8080/page"
    status, _, guest = await through_proxy(path, headers=headers, by_header=by_header, sent=sent)
    assert (status, guest.targets) == (200, [b"/page"])
    assert policies(sent) == ([POLICY[1]] if sandboxed else [])
    assert b"allow-same-origin" not in POLICY[1]
