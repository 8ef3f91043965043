"""The HTTP layers under the registry client: which scheme a host gets, and retries."""

from __future__ import annotations

import email.utils
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

__all__ = ["RetryPolicy", "RetryTransport", "base_url", "is_loopback"]

log = logging.getLogger(__name__)

# Small named defaults: three tries, waiting 0.1 s then 0.3 s; enough for a blip, not an outage.
DEFAULT_ATTEMPTS = 3
DEFAULT_BACKOFF = 0.1
DEFAULT_FACTOR = 3.0
# A registry asking us to wait longer than this is down for our purposes.
MAX_RETRY_AFTER = 10.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Only requests without side effects are replayed.
RETRY_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry connection errors and 429/5xx answers."""

    attempts: int = DEFAULT_ATTEMPTS
    backoff: float = DEFAULT_BACKOFF
    factor: float = DEFAULT_FACTOR
    statuses: frozenset[int] = RETRY_STATUSES
    max_retry_after: float = MAX_RETRY_AFTER

    def delays(self) -> Iterable[float]:
        """The waits between attempts: attempts - 1 of them."""
        delay = self.backoff
        for _ in range(max(self.attempts - 1, 0)):
            yield delay
            delay *= self.factor


class RetryTransport(httpx.BaseTransport):
    """Wraps a transport; replays GET/HEAD on connection errors and retryable statuses."""

    def __init__(
        self,
        inner: httpx.BaseTransport,
        policy: RetryPolicy,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._inner = inner
        self._policy = policy
        self._sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method not in RETRY_METHODS:
            return self._inner.handle_request(request)
        for delay in self._policy.delays():
            try:
                response = self._inner.handle_request(request)
            except httpx.TransportError as exc:
                log.debug("retrying %s %s after %r", request.method, request.url.host, exc)
                self._sleep(delay)
                continue
            if response.status_code not in self._policy.statuses:
                return response
            wait = _retry_after(response, self._policy.max_retry_after)
            response.close()
            log.debug("retrying %s %s after %s", request.method, request.url, response.status_code)
            self._sleep(delay if wait is None else wait)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def _retry_after(response: httpx.Response, cap: float) -> float | None:
    """Seconds from a Retry-After header (delta or HTTP date), capped; None if absent/bad."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), cap)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - datetime.now(UTC)).total_seconds(), 0.0), cap)


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and [::1], with or without a port."""
    name = host.lower()
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def base_url(host: str, insecure_registries: Iterable[str] = ()) -> str:
    """`http://host` for loopback and listed insecure registries, else https.

    Docker tries HTTPS first for listed insecure registries; we go straight to HTTP.
    """
    insecure = host in set(insecure_registries) or is_loopback(host)
    return f"{'http' if insecure else 'https'}://{host}"
