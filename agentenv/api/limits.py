"""Bounds on what a control-plane request may carry: its body, metadata and env vars.

E2B publishes no numbers for these; ours keep any one request (and every list that
returns what it stored) small: 64 entries, keys up to 256 bytes, values up to 4 KiB.
File uploads never pass here: they go to the guest through the proxy, streamed.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from ..errors import Overloaded, TooLarge, error_answer

MAX_ENTRIES = 64
MAX_KEY_BYTES = 256
MAX_VALUE_BYTES = 4096
# Printable text only: a NUL or control byte in a name is never meant, and breaks paths.
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _bounded(what: str, key_forbids: str) -> Callable[[dict[str, str]], dict[str, str]]:
    def check(entries: dict[str, str]) -> dict[str, str]:
        if len(entries) > MAX_ENTRIES:
            raise ValueError(f"{what}: at most {MAX_ENTRIES} entries, {len(entries)} given")
        for key, value in entries.items():
            if not 0 < _utf8_bytes(what, key) <= MAX_KEY_BYTES:
                raise ValueError(f"{what}: keys must be 1 to {MAX_KEY_BYTES} bytes")
            if _utf8_bytes(what, value) > MAX_VALUE_BYTES:
                raise ValueError(f"{what}: values are at most {MAX_VALUE_BYTES} bytes")
            if "\x00" in key or "\x00" in value:
                raise ValueError(f"{what}: NUL bytes are not allowed")
            if any(c in key for c in key_forbids):
                raise ValueError(f"{what}: keys may not contain {key_forbids!r}")
        return entries

    return check


def _utf8_bytes(what: str, text: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:  # a lone surrogate, which JSON can carry
        raise ValueError(f"{what}: not valid UTF-8") from None


def _schema(key_forbids: str) -> dict[str, Any]:
    """The bounds as JSON Schema, for clients and the fuzzer; lengths there count
    characters, which are never more than the bytes checked."""
    return {
        "type": "object",
        "maxProperties": MAX_ENTRIES,
        "propertyNames": {
            "minLength": 1,
            "maxLength": MAX_KEY_BYTES,
            "pattern": f"^[^\\x00{key_forbids}]*$",
        },
        "additionalProperties": {
            "type": "string",
            "maxLength": MAX_VALUE_BYTES,
            "pattern": "^[^\\x00]*$",
        },
    }


Metadata = Annotated[
    dict[str, str],
    AfterValidator(_bounded("metadata", "")),
    Field(json_schema_extra=_schema("")),
]
# An environment variable's name ends at its first '=': one with '=' in it cannot be set.
EnvVars = Annotated[
    dict[str, str],
    AfterValidator(_bounded("envVars", "=")),
    Field(json_schema_extra=_schema("=")),
]

# A header's name is an HTTP token; a line break in its value would start another header.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _header_values(entries: dict[str, str]) -> dict[str, str]:
    _bounded("headers", "")(entries)
    for name, value in entries.items():
        if not _HEADER_NAME.match(name):
            raise ValueError(f"headers: {name!r} is not a header name")
        if "\r" in value or "\n" in value:
            raise ValueError(f"headers: the value of {name!r} holds a line break")
    return entries


HeaderValues = Annotated[
    dict[str, str],
    AfterValidator(_header_values),
    Field(json_schema_extra=_schema("")),
]


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands on a body already read, whole, then what `receive` brings."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413 before it is parsed;
    bodies are read up to the limit and handed on whole (but those of `streamed` routes)."""

    def __init__(self, app: Any, max_bytes: int, streamed: tuple[str, ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Path prefixes whose routes stream their bodies and bound them themselves.
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.streamed):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, replaying(bytes(body), receive), send)

    async def _refuse(self, send: Send) -> None:
        answer = error_answer(TooLarge(f"request body over {self.max_bytes} bytes"))
        for message in answer.asgi_messages((b"connection", b"close")):
            await send(message)


class InFlightLimit:
    """ASGI middleware: past `limit` requests being served at once, the next is answered
    429 with `Retry-After` at once (Kubernetes' API server sheds load the same way);
    `exempt` paths (health) always pass."""

    def __init__(self, app: Any, limit: int, exempt: tuple[str, ...] = ()) -> None:
        self.app = app
        self.limit = limit
        self.exempt = exempt
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            busy = Overloaded(f"the server is serving {self.limit} requests at once: retry")
            for message in error_answer(busy).asgi_messages():
                await send(message)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
