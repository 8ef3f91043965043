"""The proxy's token check decides on the path exactly as the guest agent receives it."""

from __future__ import annotations

import pytest

from agentenv.proxy.router import _token_ok
from agentenv.proxy.target import Target

TOKEN = "t0ken"


def ok(method: str, path: str, headers: dict[bytes, bytes] | None = None) -> bool:
    target = Target("iabc", 49983, path)
    scope = {"method": method, "path": path.partition("?")[0]}
    return _token_ok(scope, target, headers or {}, TOKEN)


def test_the_token_opens_everything() -> None:
    assert ok("POST", "/process.Process/Start", {b"x-access-token": TOKEN.encode()})
    assert not ok("POST", "/process.Process/Start", {b"x-access-token": b"other"})


def test_health_and_signed_files_pass_without_it() -> None:
    assert ok("GET", "/health")
    assert ok("GET", "/files?path=/etc/hostname&signature=v1_abc")
    assert not ok("GET", "/files?path=/etc/hostname")
    assert not ok("POST", "/health")


@pytest.mark.parametrize(
    "path",
    [
        "/envs%3F/files?signature=x",  # decoded, the guest sees /envs?/files
        "/envs/%2E%2E/files?signature=x",
        "/x/files?signature=x",
        "/%66iles?signature=x",  # /files, but encoded: refused rather than guessed at
        "/files?path=a%26signature%3Dx",  # the signature is inside another parameter
        "/health%3F",
    ],
)
def test_encodings_do_not_pass_for_open_routes(path: str) -> None:
    assert not ok("GET", path)
