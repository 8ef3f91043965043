"""Signed `/files` URLs that name no sandbox: the signature itself says whose they are.

An SDK given `E2B_SANDBOX_URL` builds download and upload URLs on that one address, with no
sandbox in the host name, and a browser or `curl` sends them without E2B's routing headers.
Only the sandbox whose access token made the signature can match it, so the proxy looks for
that sandbox among the running ones (one SHA-256 per sandbox with a token).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from yarl import URL

from ..guest.agent.signing import READ, WRITE, signed_by
from ..runtime.sandboxes.routes import Route
from ..wire import ENVD_FILES_ROUTE, ENVD_PORT
from .target import Target

_OPERATIONS = {"GET": READ, "POST": WRITE}


def signer_target(
    method: str, raw_target: str, routes: Callable[[], Iterable[tuple[str, Route]]]
) -> Target | None:
    """The agent port of the sandbox that signed this `/files` request, if any did."""
    path, _, query_text = raw_target.partition("?")
    operation = _OPERATIONS.get(method)
    if path != ENVD_FILES_ROUTE or operation is None:
        return None
    # Split as the agent's aiohttp splits it, so both read the same parameters.
    query = {k: v for k, v in URL.build(query_string=query_text, encoded=True).query.items()}
    if "signature" not in query:
        return None
    for sandbox_id, route in routes():
        if route.access_token and signed_by(query, operation, route.access_token):
            return Target(sandbox_id, ENVD_PORT, raw_target)
    return None
