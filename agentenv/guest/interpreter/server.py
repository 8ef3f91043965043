"""The aiohttp application the SDKs call on port 49999: ``/execute`` (NDJSON stream),
``/contexts``, ``/health``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from . import outputs
from .contexts import Context, Contexts, ContextStartFailed
from .languages import UnknownLanguage

log = logging.getLogger("aenv_interpreter")

DEFAULT_CWD = os.environ.get("AENV_INTERPRETER_CWD", "/home/user")
# A keepalive after this many seconds of a quiet cell: writing is how a gone client shows.
KEEPALIVE_TICKS = 5

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message)


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    body = json.loads(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


# Browsers may call the service straight from a page (the JS SDK), as E2B's allows.
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "*",
    "Access-Control-Allow-Headers": "*",
}


@web.middleware
async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method == "OPTIONS":
        return web.Response(status=204, headers=CORS)
    try:
        response = await handler(request)
    except web.HTTPException as err:
        err.headers.update(CORS)
        raise
    if not response.prepared:
        response.headers.update(CORS)
    return response


class Service:
    """The routes over one registry of contexts."""

    def __init__(self, default_cwd: str) -> None:
        self.contexts = Contexts(default_cwd)
        # Set once the default python kernel has run a cell: /health turns 200.
        self.ready = asyncio.Event()

    async def health(self, _request: web.Request) -> web.Response:
        if not self.ready.is_set():
            return _text(503, "starting")
        return web.json_response("OK")

    async def execute(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await _json_body(request)
            code = body["code"]
            env_vars = body.get("env_vars") or {}
            if not isinstance(code, str) or not isinstance(env_vars, dict):
                raise ValueError("code must be a string and env_vars an object")
        except (ValueError, KeyError) as err:
            return _text(400, f"invalid request: {err}")
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            return _text(400, "Only one of context_id or language can be provided")
        context: Context | None
        try:
            if context_id:
                context = self.contexts.get(context_id)
            else:
                context = await self.contexts.default(language)
        except UnknownLanguage as err:
            return _text(400, str(err))
        except ContextStartFailed as err:
            return _text(500, str(err))
        if context is None:
            return _text(404, f"Context {context_id} not found")

        token = request.headers.get("X-Access-Token")
        run = context.execute(code, {str(k): str(v) for k, v in env_vars.items()}, token)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", **CORS})
        quiet = 0
        try:
            await response.prepare(request)
            async for output in run.stream():
                if output is None:
                    quiet += 1
                    if quiet % KEEPALIVE_TICKS:
                        continue
                    output = outputs.KEEPALIVE
                await response.write(outputs.line(output))
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            await asyncio.shield(run.abandon())
            raise
        return response

    async def create_context(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            context = await self.contexts.create(body.get("language"), body.get("cwd"))
        except (ValueError, UnknownLanguage) as err:
            return _text(400, str(err))
        except ContextStartFailed as err:
            return _text(500, str(err))
        return web.json_response(context.describe())

    async def list_contexts(self, _request: web.Request) -> web.Response:
        return web.json_response(self.contexts.list())

    async def restart_context(self, request: web.Request) -> web.Response:
        context_id = request.match_info["context_id"]
        context = self.contexts.get(context_id)
        if context is None:
            return _text(404, f"Context {context_id} not found")
        try:
            await context.restart()
        except Exception as err:
            log.exception("restarting context %s", context_id)
            return _text(500, f"Failed to restart context {context_id}: {err}")
        return web.json_response(None)

    async def remove_context(self, request: web.Request) -> web.Response:
        context_id = request.match_info["context_id"]
        if not await self.contexts.remove(context_id):
            return _text(404, f"Context {context_id} not found")
        return web.json_response(None)

    async def lifetime(self, _app: web.Application) -> AsyncIterator[None]:
        """Warm the default python context in the background; shut every kernel down."""
        task = asyncio.create_task(self._warm())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await self.contexts.close()

    async def _warm(self) -> None:
        try:
            context = await self.contexts.default("python")
            async for _ in context.kernel.execute("None", silent=True):
                pass
        except Exception:
            log.exception("the default python context did not start; /health stays 503")
            return
        self.ready.set()
        log.info("ready: default python context %s", context.id)


def make_app(default_cwd: str = DEFAULT_CWD) -> web.Application:
    service = Service(default_cwd)
    app = web.Application(middlewares=[cors])
    app.router.add_get("/health", service.health)
    app.router.add_post("/execute", service.execute)
    app.router.add_post("/contexts", service.create_context)
    app.router.add_get("/contexts", service.list_contexts)
    app.router.add_post("/contexts/{context_id}/restart", service.restart_context)
    app.router.add_delete("/contexts/{context_id}", service.remove_context)
    app.cleanup_ctx.append(service.lifetime)
    return app


async def serve(host: str, port: int, default_cwd: str = DEFAULT_CWD) -> None:
    # aiohttp >= 3.9 no longer cancels a handler whose client left unless told to; the
    # cancellation is what interrupts a cell when the SDK's timeout closes the connection.
    options: dict[str, Any] = {}
    if tuple(int(p) for p in aiohttp.__version__.split(".")[:2]) >= (3, 9):
        options["handler_cancellation"] = True
    runner = web.AppRunner(make_app(default_cwd), access_log=None, **options)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("listening on %s:%d", host, port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
