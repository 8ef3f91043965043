"""`aenv identity keys|rotate` against an httpx.MockTransport."""

from __future__ import annotations

from typing import Any

import httpx

KEYS = [
    {"kid": "old", "generation": 1, "algorithm": "ES256", "state": "signing",
     "createdAt": "2026-01-01T00:00:00Z", "activeAt": "2026-01-01T00:00:00Z"},
    {"kid": "new", "generation": 2, "algorithm": "ES256", "state": "pending",
     "createdAt": "2026-02-01T00:00:00Z", "activeAt": "2026-02-01T01:00:00Z"},
]  # fmt: skip


def handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/identity/keys/rotate":
        return httpx.Response(201, json=KEYS[1])
    return httpx.Response(200, json=KEYS)


def test_identity_keys_and_rotate(cli: Any) -> None:
    run = cli(["identity", "keys"], handler, tty=True)
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[2].split() == ["new", "2", "pending", "2026-02-01T00:00:00", "2026-02-01T01:00:00"]
    run = cli(["identity", "rotate"], handler)
    assert run.code == 0, run.stderr
    assert [(r.method, r.url.path) for r in run.requests] == [("POST", "/identity/keys/rotate")]
    assert run.stdout == "new pending, signs from 2026-02-01T01:00:00Z\n"
