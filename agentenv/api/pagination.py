"""`nextToken` cursors of E2B's paginated lists: the last item's time and id (or its name
alone, for lists ordered by name), opaque."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from ..errors import InvalidInput


def encode_cursor(when: datetime, key: str) -> str:
    return base64.urlsafe_b64encode(f"{when.isoformat()}|{key}".encode()).decode()


def decode_cursor(token: str) -> tuple[datetime, str]:
    try:
        started, key = base64.urlsafe_b64decode(token.encode()).decode().split("|", 1)
        when = datetime.fromisoformat(started)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("invalid nextToken") from exc
    if when.tzinfo is None:  # ours always carry one; a naive time cannot be compared
        raise InvalidInput("invalid nextToken: its time has no timezone")
    return when, key


def encode_name_cursor(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode()


def decode_name_cursor(token: str) -> str:
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("invalid nextToken") from exc
