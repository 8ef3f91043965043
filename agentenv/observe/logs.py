"""Request ids and log lines: every HTTP request gets an id (the caller's `X-Request-Id`
when it sends a sane one), carried into every log line written while it is served, sent
back in the response and passed on when the control plane relays the request to a node.
Logs are text, or one JSON object per line (`server.log_format = "json"`)."""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar
from typing import Any

from pythonjsonlogger.json import JsonFormatter

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")
HEADER = b"x-request-id"
# Printable, short, no spaces: it ends up in log lines and in headers sent on.
_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_FIELDS = "%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s"


class RequestIds:
    """ASGI middleware: one id per request, in the scope's headers and the response's."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(HEADER, b"")
        request_id = given if _SANE.match(given) else uuid.uuid4().hex.encode()
        headers = [(k, v) for k, v in scope["headers"] if k != HEADER]
        scope = {**scope, "headers": [*headers, (HEADER, request_id)]}

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*sent, (HEADER, request_id)]}
            await send(message)

        token = REQUEST_ID.set(request_id.decode())
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)


class _WithRequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def configure_logging(fmt: str) -> None:
    """Root logging for a server process: `text` or `json` lines on stderr."""
    handler = logging.StreamHandler()
    handler.addFilter(_WithRequestId())
    if fmt == "json":
        handler.setFormatter(JsonFormatter(_FIELDS, rename_fields={"levelname": "level"}))
    else:
        handler.setFormatter(logging.Formatter(_FIELDS))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
