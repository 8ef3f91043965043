"""Connect RPC over HTTP/1.1 with the JSON codec, as spoken by the E2B SDK (protocol doc §3.2).

Unary calls take and return plain JSON; streaming calls use envelopes: a flag byte, a
big-endian u32 length, then the JSON message. Flag 0x02 marks the end-stream envelope.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("aenv_agent")

STREAM_CONTENT_TYPE = "application/connect+json"
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
MAX_MESSAGE = 16 * 1024 * 1024

# Connect's code -> HTTP status mapping (connectrpc.com/docs/protocol#error-codes).
HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

Message = dict[str, Any]


class ConnectError(Exception):
    """An RPC failure carrying a Connect code string such as ``not_found``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_json(self) -> Message:
        return {"code": self.code, "message": self.message}


def os_error(err: OSError, what: str) -> ConnectError:
    """Translate an OSError from a file operation into the matching Connect error."""
    code = {
        errno.ENOENT: "not_found",
        errno.EEXIST: "already_exists",
        errno.ENOTDIR: "invalid_argument",
        errno.EISDIR: "invalid_argument",
        errno.ENOTEMPTY: "failed_precondition",
        errno.EACCES: "permission_denied",
        errno.EPERM: "permission_denied",
        errno.ENOSPC: "resource_exhausted",
        errno.ELOOP: "invalid_argument",
    }.get(err.errno or 0, "internal")
    return ConnectError(code, f"{what}: {err.strerror or err}")


def encode_envelope(message: Message, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


async def read_envelope(request: web.Request) -> Message | None:
    """Read one enveloped request message; None at a clean end of body."""
    try:
        header = await request.content.readexactly(5)
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise ConnectError("invalid_argument", "truncated envelope header") from None
    flags, length = struct.unpack(">BI", header)
    if flags & FLAG_COMPRESSED:
        raise ConnectError("unimplemented", "compressed messages are not supported")
    if length > MAX_MESSAGE:
        raise ConnectError("resource_exhausted", f"message of {length} bytes is too large")
    try:
        data = await request.content.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ConnectError("invalid_argument", "truncated envelope body") from None
    if flags & FLAG_END_STREAM:
        return None
    return _decode(data)


async def iter_envelopes(request: web.Request) -> AsyncIterator[Message]:
    """Yield every enveloped message of a client-streaming request body."""
    while (msg := await read_envelope(request)) is not None:
        yield msg


def _decode(data: bytes) -> Message:
    if not data.strip():
        return {}
    try:
        msg = json.loads(data)
    except ValueError as err:
        raise ConnectError("invalid_argument", f"invalid JSON: {err}") from None
    if not isinstance(msg, dict):
        raise ConnectError("invalid_argument", "message must be a JSON object")
    return msg


def json_response(body: Any, status: int = 200) -> web.Response:
    # body= (not text=) so aiohttp does not append "; charset=utf-8".
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )


def error_response(err: ConnectError) -> web.Response:
    return json_response(err.to_json(), status=HTTP_STATUS.get(err.code, 500))


def timeout_seconds(request: web.Request) -> float | None:
    """The Connect-Timeout-Ms header as seconds, or None when absent or invalid."""
    raw = request.headers.get("Connect-Timeout-Ms", "")
    try:
        ms = int(raw)
    except ValueError:
        return None
    return ms / 1000 if ms > 0 else None


def keepalive_seconds(request: web.Request) -> float | None:
    raw = request.headers.get("Keepalive-Ping-Interval", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


class ServerStream:
    """The response side of a server-streaming call: envelopes, then one end-stream."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200)
        # Exactly this value: connectrpc rejects "; charset=utf-8" on streams.
        self.response.headers["Content-Type"] = STREAM_CONTENT_TYPE
        self.closed = False

    async def send(self, message: Message) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        await self.response.write(encode_envelope(message))

    async def close(self, error: ConnectError | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        end: Message = {"error": error.to_json()} if error else {}
        if not self.response.prepared:
            await self.response.prepare(self.request)
        await self.response.write(encode_envelope(end, FLAG_END_STREAM))
        await self.response.write_eof()


UnaryHandler = Callable[[web.Request, Message], Awaitable[Message]]
StreamHandler = Callable[[web.Request, Message, ServerStream], Awaitable[None]]
ClientStreamHandler = Callable[[web.Request, AsyncIterator[Message]], Awaitable[Message]]


def unary(fn: UnaryHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Wrap a unary RPC: JSON in, JSON out, Connect errors as non-200 JSON."""

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            if request.content_type == STREAM_CONTENT_TYPE:
                msg = await read_envelope(request) or {}
            else:
                msg = _decode(await request.read())
            return json_response(await fn(request, msg))
        except ConnectError as err:
            log_error(request, err)
            return error_response(err)
        except Exception as err:
            log.exception("%s %s: unexpected error", request.method, request.path)
            return error_response(ConnectError("internal", f"{type(err).__name__}: {err}"))

    return handler


def unary_blocking(
    fn: Callable[[web.Request, Message], Message],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A unary RPC doing blocking file system work: it runs in a worker thread."""

    async def call(request: web.Request, msg: Message) -> Message:
        return await asyncio.get_running_loop().run_in_executor(None, fn, request, msg)

    return unary(call)


def server_streaming(fn: StreamHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Wrap a server-streaming RPC; errors travel in the end-stream envelope with HTTP 200."""

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = ServerStream(request)
        error: ConnectError | None = None
        try:
            msg = await read_envelope(request) or {}
            await fn(request, msg, stream)
        except ConnectError as err:
            log_error(request, err)
            error = err
        except ConnectionResetError:
            return stream.response  # the client went away; nothing left to tell it
        except Exception as err:
            log.exception("%s %s: unexpected error", request.method, request.path)
            error = ConnectError("internal", f"{type(err).__name__}: {err}")
        try:
            await stream.close(error)
        except ConnectionResetError:
            pass
        return stream.response

    return handler


def client_streaming(
    fn: ClientStreamHandler,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Wrap a client-streaming RPC: many request envelopes, one response message."""

    async def handler(request: web.Request) -> web.StreamResponse:
        stream = ServerStream(request)
        try:
            reply = await fn(request, iter_envelopes(request))
            await stream.send(reply)
            await stream.close()
        except ConnectError as err:
            log_error(request, err)
            await stream.close(err)
        except ConnectionResetError:
            pass
        return stream.response

    return handler


def log_error(request: web.Request, err: Exception) -> None:
    log.warning("%s %s: %s", request.method, request.path, err)
