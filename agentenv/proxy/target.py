"""Which sandbox port a request is for: by header, by host name, or by `/proxy/` path."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..wire import ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER

# As ASGI spells them: lower-case bytes.
SANDBOX_ID = SANDBOX_ID_HEADER.lower().encode()
SANDBOX_PORT = SANDBOX_PORT_HEADER.lower().encode()
# How the client addressed the sandbox, as a control plane's relay (always in the path
# form) tells the node: `path`, or `other` for a header or host name.
ADDRESSED_BY = b"aenv-addressed-by"
# They name the target here and never travel on to a guest.
ROUTING_HEADERS = frozenset((SANDBOX_ID, SANDBOX_PORT, ADDRESSED_BY))
_PROXY_PATH = re.compile(r"^/proxy/([a-z0-9]+)/(\d+)(/.*)?$")


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int
    # The path (and query) the guest sees: `/proxy/<id>/<port>` is removed.
    path: str
    # Addressed by the `/proxy/` path: on the server's own origin, the console's.
    by_path: bool = False

    def shares_origin(self, headers: dict[bytes, bytes]) -> bool:
        """Whether the client reached it on the server's origin (by path, also through a
        control plane's relay)."""
        return self.by_path and headers.get(ADDRESSED_BY, b"path") == b"path"


class BadTarget(ValueError):
    """The request names a sandbox but not a usable port."""


def _port(value: str) -> int:
    # ASCII digits only: `str.isdigit` also takes '²' (a Host header is read as Latin-1),
    # which `int` then refuses.
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) < 65536:
        raise BadTarget(f"{value!r} is not a TCP port number")
    return int(value)


def _header_text(value: bytes) -> str:
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        raise BadTarget("E2b-Sandbox-Id and E2b-Sandbox-Port must be ASCII") from None


def find_target(headers: dict[bytes, bytes], raw_path: str, domain: str) -> Target | None:
    """Header `E2b-Sandbox-Id` wins, then host `{port}-{id}.{domain}`, then the path form."""
    sandbox_id = headers.get(SANDBOX_ID)
    if sandbox_id is not None:
        port = headers.get(SANDBOX_PORT, str(ENVD_PORT).encode())
        return Target(_header_text(sandbox_id), _port(_header_text(port)), raw_path)
    host = headers.get(b"host", b"").decode("latin-1").rsplit(":", 1)[0].lower()
    if domain and host.endswith("." + domain.lower()):
        label = host[: -len(domain) - 1]
        port_text, sep, sandbox_id_text = label.partition("-")
        if sep and sandbox_id_text and "." not in label:
            return Target(sandbox_id_text, _port(port_text), raw_path)
    match = _PROXY_PATH.match(raw_path.split("?", 1)[0])
    if match:
        rest = match.group(3) or "/"
        query = raw_path.partition("?")[2]
        path = rest + ("?" + query if query else "")
        return Target(match.group(1), _port(match.group(2)), path, by_path=True)
    return None
