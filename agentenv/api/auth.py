"""API keys: `X-API-Key` on every control-plane request; one key per node for now."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Annotated

from fastapi import Security
from fastapi.security import APIKeyHeader

from ..errors import Unauthorized
from ..wire import API_KEY_HEADER


def load_or_create_api_key(configured: str, home: Path) -> tuple[str, bool]:
    """The configured key, else the stored one, else a new `e2b_<hex>` key (True if new)."""
    if configured:
        return configured, False
    path = home / "secrets" / "api-key"
    try:
        return path.read_text().strip(), False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = "e2b_" + secrets.token_hex(20)
    # Created with 0600 from the start, so the key is never readable by others.
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    path.with_suffix(".tmp").replace(path)
    return key, True


# Declared as a security scheme (E2B's name for it), so `/openapi.json` says every route
# needs it; the check and its errors stay ours.
_API_KEY_HEADER = APIKeyHeader(name=API_KEY_HEADER, scheme_name="ApiKeyAuth", auto_error=False)


class ApiKeyAuth:
    """A FastAPI dependency checking `X-API-Key` in constant time."""

    def __init__(self, key: str) -> None:
        self._key = key.encode()

    async def __call__(self, given: Annotated[str | None, Security(_API_KEY_HEADER)]) -> None:
        if not given:
            raise Unauthorized("missing X-API-Key header")
        if not hmac.compare_digest(given.encode(), self._key):
            raise Unauthorized("invalid API key")
