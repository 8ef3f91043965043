"""Every error leaves the API as E2B's JSON `{"code": <status>, "message": <text>}`, with
the status the error table (`agentenv.errors`) gives it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import AenvError, DependencyFailed, ErrorAnswer, error_answer
from ..state.sandboxes import store_unavailable
from .models import ErrorBody

log = logging.getLogger(__name__)

# Documented on every route, so clients and the fuzzer know the shape of a failure; it also
# keeps FastAPI from documenting its 422, which this API never sends (invalid input is 400).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "The request cannot be served as sent"},
    "5XX": {"model": ErrorBody, "description": "The node is out of capacity or failed"},
}


def error_response(answer: ErrorAnswer, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """`answer` with its retry advice, and `headers` besides."""
    return JSONResponse(
        answer.body(), status_code=answer.status, headers={**answer.headers(), **(headers or {})}
    )


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        loc = tuple(error.get("loc", ()))
        # The first part says where the field was (body, query); a field may be named "body".
        where = ".".join(str(p) for p in (loc[1:] if loc[:1] == ("body",) else loc))
        parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AenvError)
    async def _aenv(_: Request, exc: AenvError) -> JSONResponse:
        return error_response(error_answer(exc))

    # Its own handler, not the catch-all below: Starlette re-raises what that one answers.
    @app.exception_handler(DependencyFailed)
    async def _dependency(request: Request, exc: DependencyFailed) -> JSONResponse:
        answer = error_answer(exc)
        log.warning(
            "%s %s failed: %s", request.method, request.url.path, answer.message, exc_info=exc
        )
        return error_response(answer)

    @app.exception_handler(sa.exc.SQLAlchemyError)
    async def _state_store(request: Request, exc: sa.exc.SQLAlchemyError) -> JSONResponse:
        if not store_unavailable(exc):
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(error_answer(exc))
        log.warning("%s %s: the state store is unavailable: %s", request.method,
                    request.url.path, exc)  # fmt: skip
        answer = ErrorAnswer(503, "the state store cannot take the request now; try again")
        return error_response(answer, {"Retry-After": "1"})

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(ErrorAnswer(400, _describe_validation(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Its headers matter: a 405 names the allowed methods in `Allow`.
        return error_response(ErrorAnswer(exc.status_code, str(exc.detail)), exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(error_answer(exc))
