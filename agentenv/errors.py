"""The error table: every failure a client can see, its HTTP status and E2B's JSON body.

`AenvError`s are the request's own failures (bad input, not found, no capacity, a silent
guest), each with its status. `DependencyFailed`s are a host part failing (the VMM, the
object store): 503 naming the part. Anything else is a bug: 500. `error_answer` is the
one mapping, used by the API, the control plane and the data plane alike.

Each failure also says whether a retry can help, as E2B's SDKs read it: `Retry-After`
and `Should-Retry: true` when it may (no capacity, a part down for now), `Should-Retry:
false` when it cannot (a misconfiguration, a bug), nothing for the client's own faults.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

# Seconds a client is told to wait before retrying what may succeed later: the SDKs
# retry three times within their request timeout (60 s by default).
RETRY_AFTER_SECONDS = 1


class AenvError(Exception):
    """Base of every user-facing error; `status` is the HTTP status, the message is shown."""

    status = 500
    # Seconds after which a retry may succeed (`Retry-After`); None: no advice.
    retry_after: int | None = None
    # No retry can succeed: the SDKs stop at once (`Should-Retry: false`).
    permanent = False
    # E2B's machine-readable `error_code` for this failure, sent beside the message when
    # set (the SDKs turn some into exceptions of their own).
    error_code: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(AenvError):
    status = 400


class Unauthorized(AenvError):
    status = 401


class Forbidden(AenvError):
    status = 403


class NotFound(AenvError):
    status = 404


class Conflict(AenvError):
    status = 409


class GuestUnresponsiveAtPause(Conflict):
    """A memory resume of a sandbox whose guest agent did not answer when it was paused:
    that memory would bring the silent agent back (a resume without memory reboots it)."""

    error_code = "sandbox_snapshot_guest_agent_unresponsive"


class TooLarge(AenvError):
    status = 413


class Unavailable(AenvError):
    """Not enough host capacity, or a dependency is down; the client may retry later."""

    status = 503
    retry_after: int | None = RETRY_AFTER_SECONDS


class AtCapacity(Unavailable):
    """No room for the sandbox now (host memory or disk, or no node with room): 429 with
    `Retry-After`, which E2B's SDKs retry; room frees as sandboxes end or pause."""

    status = 429


class Overloaded(Unavailable):
    """The control plane serves as many requests at once as it may: 429 with
    `Retry-After` rather than a queue that grows without bound."""

    status = 429


class TemplateBeingBuilt(Unavailable):
    """A create of a built-in template while it is being built. Every node of a cluster
    gives the same answer (they share the build's state), so the control plane passes it
    on rather than asking the next node."""

    retry_after = 30
    error_code = "template_being_built"


class PermanentlyUnavailable(Unavailable):
    """A 503 no retry changes: this host lacks what the request needs (its kit, vCPUs)."""

    retry_after = None
    permanent = True


class DependencyFailed(RuntimeError):
    """A part of the host failed under a request (503); each family names its `part`.

    Not an `AenvError`: code that handles those as the request's own failure (the pressure
    loop, wake on traffic, builds) would catch these too; the runtime recovers from each
    family where it names it."""

    status = 503
    part = "a host component"
    retry_after: int | None = RETRY_AFTER_SECONDS


class ErrorAnswer(NamedTuple):
    """A failure as a client sees it: an HTTP status, a message and retry advice."""

    status: int
    message: str
    retry_after: int | None = None
    permanent: bool = False
    error_code: str | None = None

    def body(self) -> dict[str, int | str]:
        """E2B's error body, with its `error_code` when the failure has one."""
        body: dict[str, int | str] = {"code": self.status, "message": self.message}
        if self.error_code is not None:
            body["error_code"] = self.error_code
        return body

    def headers(self) -> dict[str, str]:
        """The retry advice as E2B's SDKs read it (a present `Should-Retry` is obeyed)."""
        if self.retry_after is not None:
            return {"Retry-After": str(self.retry_after), "Should-Retry": "true"}
        return {"Should-Retry": "false"} if self.permanent else {}

    def encoded(self) -> bytes:
        """The body as JSON bytes."""
        return json.dumps(self.body()).encode()

    def asgi_messages(self, *headers: tuple[bytes, bytes]) -> list[dict[str, Any]]:
        """The whole answer as raw ASGI messages, for middleware that has no JSONResponse
        (the data plane, the body limit); `headers` are added to the response's."""
        body = self.encoded()
        framing = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        advice = [(k.lower().encode(), v.encode()) for k, v in self.headers().items()]
        return [
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [*framing, *advice, *headers],
            },
            {"type": "http.response.body", "body": body},
        ]


def error_answer(exc: BaseException) -> ErrorAnswer:
    """The status, message and retry advice `exc` is answered with (the error table)."""
    if isinstance(exc, AenvError):
        return ErrorAnswer(exc.status, exc.message, exc.retry_after, exc.permanent, exc.error_code)
    if isinstance(exc, DependencyFailed):
        return ErrorAnswer(exc.status, f"{exc.part} failed: {_reason(exc)}", exc.retry_after)
    # A bug answers the same way again.
    return ErrorAnswer(500, f"internal error: {_reason(exc)}", permanent=True)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
