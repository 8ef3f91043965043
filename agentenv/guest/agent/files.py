"""The plain HTTP ``/files`` endpoint: download and upload (protocol doc §3.1).

Bodies are streamed in chunks both ways, so file size never becomes agent memory.
Errors are JSON ``{"code": <http status>, "message": ...}`` as envd sends them.
"""

from __future__ import annotations

import asyncio
import email.message
import errno
import os
import stat
from typing import Any, BinaryIO

from aiohttp import BodyPartReader, web

from . import metadata as file_metadata
from .connect import ConnectError, json_response, log_error
from .rootfs import chown
from .signing import READ, WRITE, signature_error
from .state import AgentState, get_state
from .users import User

CHUNK = 256 * 1024

_STATUS = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "resource_exhausted": 507,
}


class FilesError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _os_error(err: OSError, what: str) -> FilesError:
    status = {
        errno.ENOENT: 404,
        errno.EISDIR: 400,
        errno.ENOTDIR: 400,
        errno.EACCES: 403,
        errno.EPERM: 403,
        errno.ENOSPC: 507,
        errno.EDQUOT: 507,
    }.get(err.errno or 0, 500)
    return FilesError(status, f"{what}: {err.strerror or err}")


def _error(request: web.Request, err: FilesError) -> web.Response:
    log_error(request, err)
    return json_response({"code": err.status, "message": err.message}, status=err.status)


def _authorize(state: AgentState, request: web.Request, operation: str) -> None:
    """The access token header or a valid ``signature`` query parameter is required."""
    token = state.access_token
    if token is None or state.token_ok(request):
        return
    if "X-Access-Token" in request.headers:
        raise FilesError(401, "access token present in header but does not match")
    error = signature_error(dict(request.query), operation, token)
    if error is not None:
        raise FilesError(401, error)


def _user(state: AgentState, request: web.Request) -> User:
    try:
        return state.request_user(request, "username")
    except ConnectError as err:
        raise FilesError(_STATUS.get(err.code, 400), err.message) from None


def _open_for_read(state: AgentState, request: web.Request) -> tuple[str, BinaryIO]:
    _authorize(state, request, READ)
    user = _user(state, request)
    if not request.query.get("path"):
        raise FilesError(400, "the path query parameter is required")
    guest = state.rootfs.guest_path(request.query["path"], user)
    host = state.rootfs.host(guest)
    if os.path.isdir(host):
        raise FilesError(400, f"path {guest} is a directory")
    try:
        return guest, open(host, "rb")
    except OSError as err:
        raise _os_error(err, f"open {guest}") from None


async def download(request: web.Request) -> web.StreamResponse:
    state = get_state(request)
    loop = asyncio.get_running_loop()
    try:
        guest, fh = await loop.run_in_executor(None, _open_for_read, state, request)
    except FilesError as err:
        return _error(request, err)
    try:
        resp = web.StreamResponse(status=200)
        resp.headers["Content-Type"] = "application/octet-stream"
        resp.headers["Content-Disposition"] = f'attachment; filename="{os.path.basename(guest)}"'
        size = await loop.run_in_executor(None, _true_size, fh.fileno())
        if size is not None:
            resp.content_length = size
        await resp.prepare(request)
        # Reads go to a thread: a lazily fetched block device may stall on the network.
        while chunk := await loop.run_in_executor(None, fh.read, CHUNK):
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        fh.close()


def _true_size(fd: int) -> int | None:
    """The file's size, or None (sent chunked, read to its end) when its size is made up:
    procfs and sysfs report 0 or 4096 and have no blocks of their own."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or os.fstatvfs(fd).f_blocks == 0:
        return None
    return st.st_size


class _Sink:
    """An open upload target; the file is created (and chowned) on open, and given the
    upload's metadata (replacing what it had) on close."""

    def __init__(
        self, state: AgentState, user: User, raw_path: str, metadata: dict[str, str]
    ) -> None:
        self.guest = state.rootfs.guest_path(raw_path, user)
        self.metadata = metadata
        self.host = host = state.rootfs.host(self.guest)
        if os.path.isdir(host):
            raise FilesError(400, f"path {self.guest} is a directory")
        try:
            state.rootfs.makedirs(os.path.dirname(host), user)
            self.fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            chown(host, user)
        except OSError as err:
            raise _os_error(err, f"open {self.guest}") from None

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as err:
            raise _os_error(err, f"write {self.guest}") from None

    def close(self) -> None:
        try:
            file_metadata.replace(self.fd, self.metadata)
        except OSError as err:
            raise _os_error(err, f"set the metadata of {self.guest}") from None
        finally:
            os.close(self.fd)

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": os.path.basename(self.guest),
            "type": "file",
            "path": self.guest,
        }
        # Read back: a filesystem without xattrs (procfs, sysfs) keeps none.
        if kept := file_metadata.read(self.host):
            info["metadata"] = kept
        return info


def _part_filename(disposition: str) -> str | None:
    """The part's filename, verbatim: aiohttp strips its leading "/", but it is a full path."""
    header = email.message.Message()
    header["Content-Disposition"] = disposition
    return header.get_filename()


async def upload(request: web.Request) -> web.StreamResponse:
    state = get_state(request)
    try:
        _authorize(state, request, WRITE)
        user = _user(state, request)
        path = request.query.get("path")
        metadata = file_metadata.from_headers(request.headers.items())
        try:
            file_metadata.validate(metadata)
        except file_metadata.InvalidMetadata as err:
            raise FilesError(400, f"invalid metadata: {err}") from None
        written: list[dict[str, Any]] = []
        if request.content_type == "multipart/form-data":
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader) or part.name != "file":
                    continue  # nested multipart or an unrelated form field
                target = path or _part_filename(part.headers.get("Content-Disposition", ""))
                if not target:
                    raise FilesError(400, "a file part needs a filename or the path parameter")
                sink = _Sink(state, user, target, metadata)
                try:
                    while chunk := await part.read_chunk(CHUNK):
                        sink.write(chunk)
                finally:
                    sink.close()
                written.append(sink.info())
        else:
            if not path:
                raise FilesError(400, "the path query parameter is required")
            # aiohttp has already undone Content-Encoding: gzip on the request body.
            sink = _Sink(state, user, path, metadata)
            try:
                async for chunk in request.content.iter_chunked(CHUNK):
                    sink.write(chunk)
            finally:
                sink.close()
            written.append(sink.info())
        if not written:
            raise FilesError(400, "no file in the request")
        return json_response(written)
    except FilesError as err:
        return _error(request, err)


def setup(app: web.Application) -> None:
    app.router.add_get("/files", download)
    app.router.add_post("/files", upload)
