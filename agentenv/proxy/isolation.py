"""Guest pages on the server's own origin are sandboxed.

A sandbox addressed by the `/proxy/{id}/{port}/` path answers on the same origin as the
operator console, whose tab keeps the API key. Each such answer carries a Content
Security Policy `sandbox` without `allow-same-origin`: the browser gives the page an
origin of its own, so its scripts run but cannot read the console's storage or call the
API as the console. A sandbox's own origin (`{port}-{id}.{domain}`) is left as it is.
"""

from __future__ import annotations

from typing import Any

from .stream import Send

POLICY = (
    b"content-security-policy",
    b"sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads",
)


def isolated(send: Send) -> Send:
    """`send` with the policy added to the answer's headers."""

    async def send_isolated(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), POLICY]}
        await send(message)

    return send_isolated
