"""The body cap in front of the API: 413 before the app reads an oversized body."""

from __future__ import annotations

import json
from typing import Any

from agentenv.api.limits import BodyLimit

LIMIT = 100

Message = dict[str, Any]


class Recorder:
    """The app behind the cap: records the body it was given, answers 204."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call(
    chunks: list[bytes], headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[Recorder, list[Message], int]:
    """Send `chunks` as one request through the cap; returns app, answer, chunks read."""
    app = Recorder()
    pending = list(chunks)
    read = 0

    async def receive() -> Message:
        nonlocal read
        read += 1
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v2/sandboxes", "headers": headers or []}
    await BodyLimit(app, max_bytes=LIMIT)(scope, receive, send)
    return app, sent, read


def refused(sent: list[Message]) -> bool:
    body = json.loads(sent[1]["body"])
    return sent[0]["status"] == 413 and body == {
        "code": 413,
        "message": f"request body over {LIMIT} bytes",
    }


async def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    app, sent, read = await call([b"x" * 50] * 10, [(b"content-length", b"500")])
    assert refused(sent) and read == 0 and app.bodies == []


async def test_a_chunked_body_is_refused_once_past_the_cap() -> None:
    app, sent, read = await call([b"x" * 60] * 1000)
    assert refused(sent) and read == 2 and app.bodies == []


async def test_bodies_within_the_cap_reach_the_app_whole() -> None:
    app, sent, _ = await call([b"a" * 40, b"b" * 40, b"c" * 20], [(b"content-length", b"100")])
    assert app.bodies == [b"a" * 40 + b"b" * 40 + b"c" * 20]
    assert sent[0]["status"] == 204


async def test_other_scopes_pass_untouched() -> None:
    seen: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    await BodyLimit(app, max_bytes=LIMIT)({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"]
