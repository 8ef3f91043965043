"""Errors a user can cause or see, each with the HTTP status the API answers with."""

from __future__ import annotations


class AenvError(Exception):
    """Base of every user-facing error; `status` is the HTTP status, the message is shown."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(AenvError):
    status = 400


class Unauthorized(AenvError):
    status = 401


class Forbidden(AenvError):
    status = 403


class NotFound(AenvError):
    status = 404


class Conflict(AenvError):
    status = 409


class TooLarge(AenvError):
    status = 413


class Unavailable(AenvError):
    """Not enough host capacity, or a dependency is down; the client may retry later."""

    status = 503
