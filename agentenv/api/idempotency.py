"""`Idempotency-Key` on the operations that make something: create, connect (and resume),
fork and snapshot. A keyed request runs once per key (`state/idempotency.py`); its
retries get the first answer, status and body, marked `Idempotent-Replayed: true`."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from starlette.datastructures import Headers

from ..errors import InvalidInput, error_answer
from ..proxy.stream import send_error
from ..state.idempotency import Answer, KeyReused, KeyStore, check_key, run_once
from ..wire import API_KEY_HEADER
from .limits import Message, Receive, Scope, Send, replaying

IDEMPOTENCY_KEY = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
# The POST routes a key makes run once: create, connect (v1, v2), resume, fork, snapshot.
_KEYED = re.compile(r"^/(?:v2/)?sandboxes(?:/[^/]+/(?:connect|resume|fork|snapshots))?$")
# Each role keeps keys of its own: a control plane relays a keyed request to a node with
# the same key, and neither may wait for the other's run.
NODE, CONTROL = "node", "control"


class IdempotentOperations:
    """ASGI middleware in front of the routes; its keys are `app.state.idempotency`."""

    def __init__(self, app: Any, role: str) -> None:
        self.app = app
        self.role = role

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keyed = (
            scope["type"] == "http" and scope["method"] == "POST" and _KEYED.match(scope["path"])
        )
        headers = Headers(scope=scope) if keyed else None
        key = headers.get(IDEMPOTENCY_KEY) if headers is not None else None
        if headers is None or key is None:
            await self.app(scope, receive, send)
            return
        try:
            check_key(key)
        except InvalidInput as exc:
            await send_error(send, error_answer(exc))
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away
        keys: KeyStore = scope["app"].state.idempotency
        # Keys are the API key's: a digest of it, never the key itself, goes into the store.
        whose = f"{self.role}/{_digest(headers.get(API_KEY_HEADER, '').encode())}"
        answered: list[Message] = []

        async def operation() -> Answer:
            async def keep(message: Message) -> None:
                answered.append(message)

            await self.app(scope, replaying(body, receive), keep)
            return _answer_of(answered)

        try:
            answer, replayed = await run_once(keys, whose, key, _request(scope, body), operation)
        except KeyReused as exc:
            await send_error(send, error_answer(exc))
            return
        if not replayed:
            for message in answered:
                await send(message)
            return
        framing = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(answer.body)),
            (REPLAYED.lower().encode(), b"true"),
        ]
        await send({"type": "http.response.start", "status": answer.status, "headers": framing})
        await send({"type": "http.response.body", "body": answer.body})


async def _read_body(receive: Receive) -> bytes | None:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


def _request(scope: Scope, body: bytes) -> str:
    """What a key stands for: the route and the body (JSON compared by its content)."""
    try:
        body = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        pass  # not JSON (the route refuses it): compared as sent
    route = f"{scope['method']} {scope['path']}?{scope['query_string'].decode('latin-1')}"
    return _digest(route.encode() + b"\0" + body)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _answer_of(messages: list[Message]) -> Answer:
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return Answer(start["status"], body)
