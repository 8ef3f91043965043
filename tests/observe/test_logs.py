"""Request ids through an ASGI app, and the log lines that carry them."""

from __future__ import annotations

import io
import json
import logging

import httpx

from agentenv.observe.logs import REQUEST_ID, RequestIds, configure_logging


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    seen = dict(scope["headers"]).get(b"x-request-id", b"").decode()
    logging.getLogger("test.app").info("serving")
    body = json.dumps({"header": seen, "context": REQUEST_ID.get()}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_an_id_is_kept_or_made_and_logged(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    stream = io.StringIO()
    configure_logging("json")
    handler = logging.getLogger().handlers[0]
    monkeypatch.setattr(handler, "stream", stream)
    transport = httpx.ASGITransport(app=RequestIds(_app))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        kept = await client.get("/", headers={"X-Request-Id": "trace-1"})
        made = await client.get("/", headers={"X-Request-Id": "bad id\twith spaces"})
    assert kept.headers["x-request-id"] == "trace-1"
    assert kept.json() == {"header": "trace-1", "context": "trace-1"}
    new = made.headers["x-request-id"]
    assert new != "bad id\twith spaces" and len(new) == 32
    assert made.json() == {"header": new, "context": new}
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    lines = [e for e in lines if e["name"] == "test.app"]  # not httpx's own lines
    assert [(e["request_id"], e["message"], e["level"]) for e in lines] == [
        ("trace-1", "serving", "INFO"),
        (new, "serving", "INFO"),
    ]
    assert REQUEST_ID.get() == "-"  # nothing leaks past a request
    configure_logging("text")
