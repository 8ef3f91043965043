"""Signed `/files` URLs (envd's v1 signatures): a SHA-256 over the request and the token."""

from __future__ import annotations

import hashlib
import hmac
import time
from base64 import b64encode

READ = "read"
WRITE = "write"


def file_signature(path: str, operation: str, username: str, token: str, expiration: str) -> str:
    """The signature a client computes for `path` (empty `expiration`: it never expires)."""
    raw = f"{path}:{operation}:{username}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + b64encode(digest).decode().rstrip("=")


def signed_by(query: dict[str, str], operation: str, token: str) -> bool:
    """True when the query's signature was made with `token` (expired or not)."""
    expected = file_signature(
        query.get("path", ""),
        operation,
        query.get("username", ""),
        token,
        query.get("signature_expiration", ""),
    )
    return hmac.compare_digest(expected.encode(), query.get("signature", "").encode())


def signature_error(query: dict[str, str], operation: str, token: str) -> str | None:
    """Why a signed request is refused, in envd's words; None when it is allowed."""
    if "signature" not in query:
        return "missing signature query parameter"
    if not signed_by(query, operation, token):
        return "invalid signature"
    expiration = query.get("signature_expiration", "")
    if not expiration:
        return None
    try:
        expired = int(expiration) < time.time()
    except ValueError:
        return "signature_expiration must be an integer"
    return "signature is already expired" if expired else None
