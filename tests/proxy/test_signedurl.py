"""A signed `/files` URL with no sandbox in it goes to the sandbox whose token signed it."""

from __future__ import annotations

from urllib.parse import urlencode

from agentenv.guest.agent.signing import READ, WRITE, file_signature
from agentenv.proxy.signedurl import signer_target
from agentenv.runtime.sandboxes.routes import Route
from agentenv.wire import ENVD_PORT

ROUTES = [
    ("iopen", Route(host="10.0.0.2", access_token=None)),
    ("ialpha", Route(host="10.0.0.3", access_token="alpha-token")),
    ("ibeta", Route(host="10.0.0.4", access_token="beta-token")),
]


def signed(token: str, operation: str = READ, expiration: str = "") -> str:
    sig = file_signature("/tmp/f.txt", operation, "user", token, expiration)
    query = {"path": "/tmp/f.txt", "username": "user", "signature": sig}
    if expiration:
        query["signature_expiration"] = expiration
    return "/files?" + urlencode(query)


def test_the_signer_is_found_among_running_sandboxes() -> None:
    raw = signed("beta-token", expiration="1")
    target = signer_target("GET", raw, lambda: ROUTES)
    assert target is not None
    assert (target.sandbox_id, target.port, target.path) == ("ibeta", ENVD_PORT, raw)
    upload = signed("alpha-token", WRITE)
    assert signer_target("POST", upload, lambda: ROUTES).sandbox_id == "ialpha"


def test_nothing_else_is_taken_from_the_api() -> None:
    assert signer_target("GET", signed("other-token"), lambda: ROUTES) is None
    # Signed for reading, sent as an upload.
    assert signer_target("POST", signed("beta-token"), lambda: ROUTES) is None
    assert signer_target("GET", "/files?path=/tmp/f.txt", lambda: ROUTES) is None
    assert signer_target("GET", "/sandboxes?signature=x", lambda: ROUTES) is None
    assert signer_target("DELETE", signed("beta-token"), lambda: ROUTES) is None
