"""Registry failures as data: the spec's JSON error list, with status, method and a safe URL."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx

from .. import errors

__all__ = [
    "DigestMismatch",
    "ErrorDetail",
    "NoMatchingPlatform",
    "RegistryAuthError",
    "RegistryError",
    "RegistryNotFound",
    "RegistryUnreachable",
    "error_from_response",
    "redact_url",
]

# Error bodies are small; a misbehaving server must not make us buffer a blob.
MAX_ERROR_BODY = 64 * 1024
# Spec codes that mean "this name or reference does not exist".
NOT_FOUND_CODES = frozenset({"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"})


@dataclass(frozen=True)
class ErrorDetail:
    """One entry of the registry's `{"errors": [...]}` list."""

    code: str
    message: str
    detail: object = None


class RegistryError(errors.AenvError):
    """A registry answered with an error; `status` is its HTTP status, `code` the spec's code."""

    def __init__(
        self,
        *,
        status: int,
        method: str,
        url: str,
        details: tuple[ErrorDetail, ...] = (),
        body: str = "",
        message: str | None = None,
    ) -> None:
        self.status = status
        self.http_status = status
        self.method = method
        self.url = redact_url(url)
        self.details = details
        self.body = body
        self.code = details[0].code if details else ""
        reason = message or _describe(details, body) or httpx.codes.get_reason_phrase(status)
        self.reason = reason
        super().__init__(f"{method} {self.url}: {status} {reason}")


class RegistryNotFound(RegistryError, errors.NotFound):
    """The repository, tag, digest or blob does not exist (or the registry will not say)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.status = 404


class RegistryAuthError(RegistryError, errors.Unauthorized):
    """The registry refused us after the auth handshake: missing or wrong credentials."""

    def __init__(self, registry: str, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.registry = registry
        self.status = 401
        self.message = f"authentication failed for {registry}: {self.reason}"
        self.args = (self.message,)


class RegistryUnreachable(errors.Unavailable):
    """The registry could not be reached, even after retries."""

    def __init__(self, registry: str, cause: Exception) -> None:
        super().__init__(f"cannot reach registry {registry}: {cause or type(cause).__name__}")
        self.registry = registry


class DigestMismatch(errors.AenvError):
    """A blob's bytes did not match its descriptor; nothing was stored."""

    status = 502

    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(f"{what}: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


class NoMatchingPlatform(errors.NotFound):
    """An image index has no manifest for the platform we run."""

    def __init__(self, ref: str, wanted: str, available: list[str]) -> None:
        listed = ", ".join(available) or "none"
        super().__init__(f"image {ref} has no {wanted} variant (available: {listed})")
        self.wanted = wanted
        self.available = available


def error_from_response(
    response: httpx.Response, *, registry: str, authenticated: bool
) -> RegistryError:
    """Turn a failed response into the matching error; reads at most MAX_ERROR_BODY bytes."""
    body = _read_capped(response)
    details = _parse_details(body)
    request = response.request
    kw: dict[str, object] = dict(
        status=response.status_code,
        method=request.method,
        url=str(request.url),
        details=details,
        body=body,
    )
    codes = {d.code for d in details}
    if response.status_code in (401, 403):
        if not authenticated:
            kw["message"] = f"{_describe(details, body) or 'unauthorized'} (no credentials)"
        return RegistryAuthError(registry, **kw)
    if response.status_code == 404 or codes & NOT_FOUND_CODES:
        return RegistryNotFound(**kw)
    return RegistryError(**kw)  # type: ignore[arg-type]


def redact_url(url: str) -> str:
    """Drop userinfo and query values: signed blob redirects carry secrets there."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = urlencode([(k, "REDACTED") for k, _ in parse_qsl(parts.query, keep_blank_values=True)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _read_capped(response: httpx.Response) -> str:
    try:
        raw = response.content
    except httpx.ResponseNotRead:
        raw = b""
        try:
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) >= MAX_ERROR_BODY:
                    break
        except httpx.HTTPError:
            pass  # the status already tells the story; a broken body must not hide it
        finally:
            response.close()
    return raw[:MAX_ERROR_BODY].decode("utf-8", "replace")


def _parse_details(body: str) -> tuple[ErrorDetail, ...]:
    try:
        doc = json.loads(body)
    except ValueError:
        return ()
    items = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return ()
    return tuple(
        ErrorDetail(str(it.get("code", "")), str(it.get("message", "")), it.get("detail"))
        for it in items
        if isinstance(it, dict)
    )


def _describe(details: tuple[ErrorDetail, ...], body: str) -> str:
    if details:
        return "; ".join(f"{d.code}: {d.message}" if d.code else d.message for d in details)
    return " ".join(body.split())[:200]
