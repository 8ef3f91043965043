"""The sandbox's log as E2B serves it: the agent's own log records (processes started and
ended, failed requests, reclaims), kept in guest memory, so a pause keeps them too."""

from __future__ import annotations

import collections
import logging
from typing import Any

from aiohttp import web

from .connect import json_response
from .state import app_key

# The newest records; older ones are dropped.
MAX_ENTRIES = 2000
_LEVELS = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error"}


class EventLog(logging.Handler):
    """A logging handler keeping records as E2B log entries."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_ENTRIES)

    def emit(self, record: logging.LogRecord) -> None:
        fields = {k: str(v) for k, v in getattr(record, "fields", {}).items()}
        self.entries.append({
            "timestampMs": int(record.created * 1000),
            "level": _LEVELS.get(record.levelname, "error"),
            "logger": record.name,
            "message": record.getMessage(),
            "fields": fields,
        })  # fmt: skip

    def since(self, start_ms: int) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["timestampMs"] >= start_ms]


EVENT_LOG_KEY = app_key("aenv_event_log", EventLog)


async def logs(request: web.Request) -> web.Response:
    """`GET /logs?start=<ms>`: entries at or after that time, oldest first."""
    try:
        start = int(request.query.get("start", "0"))
    except ValueError:
        return json_response({"code": 400, "message": "start must be milliseconds"}, status=400)
    return json_response({"entries": request.app[EVENT_LOG_KEY].since(start)})


def setup(app: web.Application, logger: logging.Logger) -> None:
    handler = EventLog()
    logger.addHandler(handler)
    app[EVENT_LOG_KEY] = handler
    app.router.add_get("/logs", logs)

    async def _detach(_app: web.Application) -> None:
        logger.removeHandler(handler)

    app.on_cleanup.append(_detach)
