"""The ``filesystem.Filesystem`` Connect service (protocol doc §3.4).

Paths from clients are guest paths (``~`` and relative ones start at the user's home);
they are mapped under the rootfs by :class:`RootFS`, and answers carry absolute guest paths.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from . import metadata as file_metadata
from .connect import (
    ConnectError,
    Message,
    ServerStream,
    keepalive_seconds,
    os_error,
    server_streaming,
    timeout_seconds,
    unary,
    unary_blocking,
)
from .state import AgentState, app_key, get_state
from .users import User
from .watch import DirWatcher, on_network_mount

WATCHER_EVENT_LIMIT = 10_000  # polled watchers keep at most this many unread events

# Go's os.FileMode.String() letters, which envd reports as "permissions".
_MODE_LETTERS = [
    (stat.S_ISDIR, "d"),
    (stat.S_ISLNK, "L"),
    (stat.S_ISBLK, "D"),
    (stat.S_ISCHR, "Dc"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "S"),
]


def permissions(mode: int) -> str:
    """Render a mode the way Go does: ``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``."""
    prefix = "".join(letter for test, letter in _MODE_LETTERS if test(mode))
    if mode & stat.S_ISUID:
        prefix += "u"
    if mode & stat.S_ISGID:
        prefix += "g"
    if mode & stat.S_ISVTX:
        prefix += "t"
    bits = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (prefix or "-") + bits


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _file_type(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "FILE_TYPE_DIRECTORY"
    if stat.S_ISLNK(mode):
        return "FILE_TYPE_SYMLINK"
    return "FILE_TYPE_FILE"


def entry_info(state: AgentState, guest: str) -> Message:
    """EntryInfo of a guest path without following a final symlink (raises OSError)."""
    host = state.rootfs.host(guest, follow=False)
    st = os.lstat(host)
    entry: Message = {
        "name": os.path.basename(guest) or "/",
        "type": _file_type(st.st_mode),
        "path": guest,
        "size": str(st.st_size),
        "mode": stat.S_IMODE(st.st_mode) & 0o777,
        "permissions": permissions(st.st_mode),
        "owner": state.users.user_name(st.st_uid),
        "group": state.users.group_name(st.st_gid),
        "modifiedTime": rfc3339(st.st_mtime),
    }
    if stat.S_ISLNK(st.st_mode):
        entry["isSymlink"] = True
        # Resolved inside the user's root: the agent's own root may differ.
        host = state.rootfs.host(guest, follow=True)
        entry["symlinkTarget"] = state.rootfs.to_guest(host)
        try:
            entry["type"] = _file_type(os.stat(host).st_mode)
        except OSError:
            pass  # dangling link: keep FILE_TYPE_SYMLINK
    if found := file_metadata.read(host):
        entry["metadata"] = found
    return entry


def _path(state: AgentState, request: web.Request, raw: Any) -> tuple[str, User]:
    user = state.request_user(request)
    return state.rootfs.guest_path(str(raw or ""), user), user


@unary_blocking
def stat_entry(request: web.Request, msg: Message) -> Message:
    state = get_state(request)
    guest, _user = _path(state, request, msg.get("path"))
    try:
        return {"entry": entry_info(state, guest)}
    except OSError as err:
        raise os_error(err, f"stat {guest}") from None


@unary_blocking
def make_dir(request: web.Request, msg: Message) -> Message:
    state = get_state(request)
    guest, user = _path(state, request, msg.get("path"))
    host = state.rootfs.host(guest)
    if os.path.lexists(host):
        if os.path.isdir(host):
            raise ConnectError("already_exists", f"directory {guest} already exists")
        raise ConnectError("invalid_argument", f"path {guest} exists and is not a directory")
    try:
        state.rootfs.makedirs(host, user)
        return {"entry": entry_info(state, guest)}
    except OSError as err:
        raise os_error(err, f"make dir {guest}") from None


@unary_blocking
def move(request: web.Request, msg: Message) -> Message:
    state = get_state(request)
    src, user = _path(state, request, msg.get("source"))
    dst, _user = _path(state, request, msg.get("destination"))
    src_host = state.rootfs.host(src, follow=False)
    dst_host = state.rootfs.host(dst, follow=False)
    try:
        os.lstat(src_host)
        state.rootfs.makedirs(os.path.dirname(dst_host), user)
        os.rename(src_host, dst_host)
        return {"entry": entry_info(state, dst)}
    except OSError as err:
        raise os_error(err, f"move {src} to {dst}") from None


@unary_blocking
def list_dir(request: web.Request, msg: Message) -> Message:
    state = get_state(request)
    guest, _user = _path(state, request, msg.get("path"))
    depth = max(int(msg.get("depth") or 1), 1)
    host = state.rootfs.host(guest)
    if not os.path.exists(host):
        raise ConnectError("not_found", f"directory {guest} not found")
    if not os.path.isdir(host):
        raise ConnectError("invalid_argument", f"path {guest} is not a directory")
    # Report paths under the resolved directory, as envd does for a symlinked dir.
    base = state.rootfs.to_guest(host)
    entries: list[Message] = []

    def walk(dir_guest: str, level: int) -> None:
        try:
            names = sorted(os.listdir(state.rootfs.host(dir_guest)))
        except OSError:
            return  # unreadable or vanished subdirectory: skip it, like envd's walker
        for name in names:
            child = dir_guest.rstrip("/") + "/" + name
            try:
                info = entry_info(state, child)
            except OSError:
                continue
            entries.append(info)
            if (
                level < depth
                and info["type"] == "FILE_TYPE_DIRECTORY"
                and not info.get("isSymlink")
            ):
                walk(child, level + 1)

    walk(base, 1)
    return {"entries": entries}


@unary_blocking
def remove(request: web.Request, msg: Message) -> Message:
    state = get_state(request)
    guest, _user = _path(state, request, msg.get("path"))
    host = state.rootfs.host(guest, follow=False)
    if host == state.rootfs.root:
        raise ConnectError("invalid_argument", "refusing to remove the root directory")
    try:
        if os.path.isdir(host) and not os.path.islink(host):
            shutil.rmtree(host)
        else:
            os.unlink(host)
    except FileNotFoundError:
        pass  # rm -rf semantics
    except OSError as err:
        raise os_error(err, f"remove {guest}") from None
    return {}


@dataclass
class PolledWatcher:
    """A watcher for the sync SDK: events are buffered until GetWatcherEvents drains them."""

    watcher: DirWatcher
    events: list[Message] = field(default_factory=list)


WATCHERS_KEY = app_key("aenv_watchers", dict)


def _start_watch(
    state: AgentState, request: web.Request, msg: Message, sink: Any
) -> tuple[DirWatcher, str]:
    guest, _user = _path(state, request, msg.get("path"))
    host = state.rootfs.host(guest)
    if not os.path.exists(host):
        raise ConnectError("not_found", f"directory {guest} not found")
    if not os.path.isdir(host):
        raise ConnectError("invalid_argument", f"path {guest} is not a directory")
    allow_network = bool(msg.get("allowNetworkMounts") or msg.get("allow_network_mounts"))
    try:
        if not allow_network and on_network_mount(host):
            raise ConnectError(
                "invalid_argument", f"cannot watch path on network filesystem: {guest}"
            )
    except OSError as err:
        raise os_error(err, f"watch {guest}") from None
    include_entry = bool(msg.get("includeEntry") or msg.get("include_entry"))
    base = state.rootfs.to_guest(host)

    def on_event(rel: str, kind: str, _host: str) -> None:
        event: Message = {"name": rel, "type": kind}
        if include_entry and kind not in ("EVENT_TYPE_REMOVE", "EVENT_TYPE_RENAME"):
            try:
                event["entry"] = entry_info(state, base.rstrip("/") + "/" + rel)
            except OSError:
                pass
        sink(event)

    try:
        return DirWatcher(host, bool(msg.get("recursive")), on_event), guest
    except OSError as err:
        raise os_error(err, f"watch {guest}") from None


@server_streaming
async def watch_dir(request: web.Request, msg: Message, stream: ServerStream) -> None:
    state = get_state(request)
    queue: asyncio.Queue[Message] = asyncio.Queue()
    watcher, _guest = _start_watch(state, request, msg, queue.put_nowait)
    loop = asyncio.get_running_loop()
    keepalive = keepalive_seconds(request)
    deadline = timeout_seconds(request)
    until = loop.time() + deadline if deadline else None
    try:
        await stream.send({"start": {}})
        while True:
            wait = keepalive
            if until is not None:
                left = until - loop.time()
                if left <= 0:
                    raise ConnectError("deadline_exceeded", "watch deadline exceeded")
                wait = min(wait, left) if wait else left
            try:
                event = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                await stream.send({"keepalive": {}})
                continue
            await stream.send({"filesystem": event})
    finally:
        watcher.close()


@unary
async def create_watcher(request: web.Request, msg: Message) -> Message:
    state = get_state(request)
    events: list[Message] = []

    def sink(event: Message) -> None:
        if len(events) < WATCHER_EVENT_LIMIT:
            events.append(event)

    watcher, _guest = _start_watch(state, request, msg, sink)
    polled = PolledWatcher(watcher, events)
    watcher_id = uuid.uuid4().hex
    request.app[WATCHERS_KEY][watcher_id] = polled
    return {"watcherId": watcher_id}


def _watcher_id(msg: Message) -> str:
    return str(msg.get("watcherId") or msg.get("watcher_id") or "")


@unary
async def get_watcher_events(request: web.Request, msg: Message) -> Message:
    polled = request.app[WATCHERS_KEY].get(_watcher_id(msg))
    if polled is None:
        raise ConnectError("not_found", f"watcher {_watcher_id(msg)!r} not found")
    events = list(polled.events)
    polled.events.clear()  # the watcher's sink keeps appending to this same list
    return {"events": events}


@unary
async def remove_watcher(request: web.Request, msg: Message) -> Message:
    polled = request.app[WATCHERS_KEY].pop(_watcher_id(msg), None)
    if polled is None:
        raise ConnectError("not_found", f"watcher {_watcher_id(msg)!r} not found")
    polled.watcher.close()
    return {}


def setup(app: web.Application) -> None:
    """Register the service's routes and the table of polled watchers."""
    watchers: dict[str, PolledWatcher] = {}
    app[WATCHERS_KEY] = watchers

    async def _close_watchers(_app: web.Application) -> None:
        for polled in watchers.values():
            polled.watcher.close()
        watchers.clear()

    app.on_cleanup.append(_close_watchers)
    prefix = "/filesystem.Filesystem/"
    for name, handler in {
        "Stat": stat_entry,
        "MakeDir": make_dir,
        "Move": move,
        "ListDir": list_dir,
        "Remove": remove,
        "WatchDir": watch_dir,
        "CreateWatcher": create_watcher,
        "GetWatcherEvents": get_watcher_events,
        "RemoveWatcher": remove_watcher,
    }.items():
        app.router.add_post(prefix + name, handler)
