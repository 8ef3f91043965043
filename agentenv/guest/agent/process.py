"""The ``process.Process`` Connect service (protocol doc §3.3).

Start/Connect stream ``{"event": ...}`` messages: first ``start {pid}``, then ``data``
(base64 ``stdout``/``stderr``/``pty``) and idle ``keepalive``s, finally ``end``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from .connect import (
    ConnectError,
    Message,
    ServerStream,
    client_streaming,
    keepalive_seconds,
    server_streaming,
    timeout_seconds,
    unary,
)
from .proc import OVERFLOW, ManagedProcess, ProcessTable, SpawnSpec, Subscriber
from .state import AgentState, app_key, get_state

# The shell E2B's clients ask for, and the one every image has.
BASH = "/bin/bash"
SH = "/bin/sh"
SIGNALS = {"SIGNAL_SIGTERM": signal.SIGTERM, "SIGNAL_SIGKILL": signal.SIGKILL, 15: 15, 9: 9}
PROC_KEY = app_key("aenv_processes", ProcessTable)


def _table(request: web.Request) -> ProcessTable:
    return request.app[PROC_KEY]


def _pty_size(pty: Any) -> tuple[int, int]:
    size = (pty or {}).get("size") or {}
    return int(size.get("cols") or 80), int(size.get("rows") or 24)


def _find(request: web.Request, msg: Message) -> ManagedProcess:
    selector = msg.get("process") or {}
    proc = _table(request).find(selector)
    if proc is None:
        raise ConnectError("not_found", f"process {selector} not found")
    return proc


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(value or "", validate=False)
    except (binascii.Error, TypeError):
        raise ConnectError("invalid_argument", "input is not valid base64") from None


def _shell_there(state: AgentState, cmd: str) -> str:
    """E2B's SDKs and CLI run everything with `/bin/bash`: in an image without bash
    (busybox, alpine) the image's `/bin/sh` takes the same `-l`, `-i` and `-c`."""
    if cmd != BASH or os.path.exists(state.rootfs.host(BASH)):
        return cmd
    return SH if os.path.exists(state.rootfs.host(SH)) else cmd


def _spec(state: AgentState, request: web.Request, msg: Message) -> tuple[SpawnSpec, Message]:
    """Build the spawn spec of a StartRequest: user, environment layers and working dir."""
    config = msg.get("process") or {}
    cmd = config.get("cmd")
    if not cmd:
        raise ConnectError("invalid_argument", "process.cmd is required")
    args = [str(a) for a in config.get("args") or []]
    user = state.request_user(request)
    env = (
        user.base_env()
        | state.env_vars
        | {str(k): str(v) for k, v in (config.get("envs") or {}).items()}
    )
    cwd = state.rootfs.guest_path(config.get("cwd") or state.default_workdir or "", user)
    if not os.path.isdir(state.rootfs.host(cwd)):
        if config.get("cwd"):
            raise ConnectError("invalid_argument", f"cwd {cwd!r} does not exist or is not a dir")
        cwd = "/"  # a default that is missing (e.g. nobody's /nonexistent home) is not an error
    pty = msg.get("pty")
    spec = SpawnSpec(
        cmd=_shell_there(state, str(cmd)),
        args=args,
        env=env,
        cwd=cwd,
        user=user,
        rootfs=state.rootfs.root,
        pty_size=_pty_size(pty) if pty is not None else None,
        stdin=bool(msg.get("stdin")),
    )
    return spec, config


async def _pump(
    request: web.Request,
    stream: ServerStream,
    proc: ManagedProcess,
    sub: Subscriber,
    deadline: float | None,
) -> ConnectError | None:
    """Forward a subscriber's events to a stream; returns the end-stream error, if any."""
    loop = asyncio.get_running_loop()
    keepalive = keepalive_seconds(request)
    until = loop.time() + deadline if deadline else None
    await stream.send({"event": {"start": {"pid": proc.pid}}})
    while True:
        wait = keepalive
        if until is not None:
            left = until - loop.time()
            if left <= 0:
                return ConnectError("deadline_exceeded", "stream deadline exceeded")
            wait = min(wait, left) if wait else left
        try:
            item = await asyncio.wait_for(sub.queue.get(), wait)
        except TimeoutError:
            if until is None or loop.time() < until:
                await stream.send({"event": {"keepalive": {}}})
            continue
        if item is OVERFLOW:
            return ConnectError("resource_exhausted", "client is reading output too slowly")
        event, size = item
        sub.pending -= size
        await stream.send(event)
        if "end" in event["event"]:
            if proc.deadline_hit:
                return ConnectError("deadline_exceeded", "process deadline exceeded")
            return None


@server_streaming
async def start(request: web.Request, msg: Message, stream: ServerStream) -> None:
    state = get_state(request)
    spec, config = _spec(state, request, msg)
    deadline = timeout_seconds(request)
    try:
        proc, sub = _table(request).start(spec, config, msg.get("tag"), deadline)
    except FileNotFoundError as err:
        raise ConnectError("not_found", f"error starting process: {err}") from None
    except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as err:
        raise ConnectError("internal", f"error starting process: {err}") from None
    try:
        if error := await _pump(request, stream, proc, sub, None):
            raise error
    finally:
        proc.unsubscribe(sub)  # the process itself keeps running


@server_streaming
async def connect(request: web.Request, msg: Message, stream: ServerStream) -> None:
    proc = _find(request, msg)
    sub = proc.subscribe()
    try:
        if error := await _pump(request, stream, proc, sub, timeout_seconds(request)):
            raise error
    finally:
        proc.unsubscribe(sub)


@unary
async def list_processes(request: web.Request, msg: Message) -> Message:
    procs = []
    for proc in _table(request).procs.values():
        if proc.done.is_set():
            continue
        info: Message = {"config": proc.config, "pid": proc.pid}
        if proc.tag is not None:
            info["tag"] = proc.tag
        procs.append(info)
    return {"processes": procs}


async def _send(proc: ManagedProcess, data: Message) -> None:
    try:
        if "pty" in data:
            await proc.write_input(_b64(data["pty"]), to_pty=True)
        elif "stdin" in data:
            await proc.write_input(_b64(data["stdin"]), to_pty=proc.pty_fd is not None)
    except LookupError as err:
        raise ConnectError("failed_precondition", str(err)) from None
    except BrokenPipeError:
        raise ConnectError("failed_precondition", f"process {proc.pid} closed its input") from None


@unary
async def send_input(request: web.Request, msg: Message) -> Message:
    await _send(_find(request, msg), msg.get("input") or {})
    return {}


@client_streaming
async def stream_input(request: web.Request, messages: AsyncIterator[Message]) -> Message:
    proc: ManagedProcess | None = None
    async for msg in messages:
        if "start" in msg:
            proc = _find(request, msg["start"])
        elif "data" in msg:
            if proc is None:
                raise ConnectError("failed_precondition", "data before start event")
            await _send(proc, (msg["data"] or {}).get("input") or {})
    return {}


@unary
async def close_stdin(request: web.Request, msg: Message) -> Message:
    proc = _find(request, msg)
    if proc.pty_fd is not None and proc.stdin_fd is None:
        raise ConnectError("failed_precondition", "cannot close stdin of a pty process")
    proc.close_stdin()
    return {}


@unary
async def send_signal(request: web.Request, msg: Message) -> Message:
    proc = _find(request, msg)
    signum = SIGNALS.get(msg.get("signal") or "")
    if signum is None:
        raise ConnectError("invalid_argument", f"unsupported signal {msg.get('signal')!r}")
    proc.signal(signum)
    return {}


@unary
async def update(request: web.Request, msg: Message) -> Message:
    proc = _find(request, msg)
    if msg.get("pty") is not None:
        try:
            proc.resize(*_pty_size(msg["pty"]))
        except LookupError as err:
            raise ConnectError("failed_precondition", str(err)) from None
    return {}


def setup(app: web.Application) -> None:
    """Register the service's routes and its process table."""
    app[PROC_KEY] = table = ProcessTable()

    async def _shutdown(_app: web.Application) -> None:
        await table.shutdown()

    app.on_cleanup.append(_shutdown)
    prefix = "/process.Process/"
    for name, handler in {
        "Start": start,
        "Connect": connect,
        "List": list_processes,
        "SendInput": send_input,
        "StreamInput": stream_input,
        "CloseStdin": close_stdin,
        "SendSignal": send_signal,
        "Update": update,
    }.items():
        app.router.add_post(prefix + name, handler)
