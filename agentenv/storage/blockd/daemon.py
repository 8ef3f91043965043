"""The block daemon: one long-lived process per home serving layer stacks as files.

It mounts `BlockFS` at `<home>/blockd/mnt`, answers JSON lines on
`<home>/blockd/control.sock` and records what it serves in `<home>/blockd/mounts.json`,
so a restarted daemon serves the same files again. It is started in its own session and
outlives the API server. SIGTERM/SIGINT unmount and exit; a VMM that still has a file
open then gets errors, so stop the daemon only when no sandbox uses it. A crashed daemon
leaves a dead mount behind, which the next start detaches (`umount -l`) first.

Mount options: `ro` and EROFS handlers (writes go to the per-sandbox qcow2 overlay, never
here); `default_permissions` so the kernel enforces the 0444/0555 modes; `allow_other` so a
VMM running under another uid (a jailer, `-run-with user=`) can still read, since FUSE
otherwise admits only the mounting uid; access is fenced by `<home>/blockd` being 0700.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from agentenv.config import Config

from ..layer import LayerIndex, Stack, layer_key
from ..objectstore import ObjectNotFound, ObjectStore
from .common import (
    LAYER_RE,
    MAX_LINE,
    NAME_RE,
    BlockdPaths,
    atomic_write,
    cleanup_stale_mount,
    is_mounted,
    mount_device,
)
from .fs import BlockFS, ChunkSource, mount_options

log = logging.getLogger(__name__)

# Kernel read-ahead for the mount (KiB); the default 128 KiB cuts sequential reads into
# small requests, each a Python round trip. Requests stay <= max_pages (1 MiB).
READ_AHEAD_KB = 4096


class RequestError(Exception):
    """A request the daemon refuses; `code` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def load_index(store: ObjectStore, local: Path, layer_id: str) -> LayerIndex:
    """A layer index, from the local copy if present, else from the store (then kept)."""
    path = local / f"{layer_id}.json"
    index = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        index = LayerIndex.from_json(path.read_bytes())
    if index is None:
        try:
            data = store.get(layer_key(layer_id))
        except ObjectNotFound:
            raise RequestError("not_found", f"layer {layer_id} is not in the store") from None
        index = LayerIndex.from_json(data)
        if index.layer_id == layer_id:
            local.mkdir(parents=True, exist_ok=True)
            atomic_write(path, data)
    if index.layer_id != layer_id:
        raise RequestError("bad_layer", f"index {layer_key(layer_id)} names {index.layer_id}")
    return index


def load_stack(store: ObjectStore, local: Path, layers: list[str]) -> Stack:
    """Blocking: the stack of `layers` (bottom to top), its parent chain checked."""
    indexes = [load_index(store, local, layer_id) for layer_id in layers]
    if indexes[0].parent is not None:
        raise RequestError(
            "bad_chain", f"bottom layer {layers[0]} sits on {indexes[0].parent}, not on nothing"
        )
    try:
        stack = Stack(indexes)
    except ValueError as exc:
        raise RequestError("bad_chain", str(exc)) from None
    return stack


def chunks_in_order(stack: Stack) -> list[str]:
    """The stack's chunks in the order of the first block that uses each (boot order-ish)."""
    seen: dict[str, None] = {}
    for block in range(-(-stack.size // stack.block_size)):
        ref = stack.lookup(block)
        if ref is not None and ref.chunk not in seen:
            seen[ref.chunk] = None
    return list(seen)


def _set_read_ahead(mnt: Path, kb: int) -> None:
    device = mount_device(mnt)
    path = Path(f"/sys/class/bdi/{device}/read_ahead_kb")
    try:
        path.write_text(str(kb))
    except OSError as exc:  # not fatal: only sequential throughput suffers
        log.info("cannot set read-ahead on %s: %s", mnt, exc)


class Daemon:
    """State and request handling; everything runs in the one trio thread."""

    def __init__(self, paths: BlockdPaths, store: ObjectStore, source: ChunkSource) -> None:
        self.paths = paths
        self.store = store
        self.source = source
        self.fs = BlockFS(source)
        # Records that could not be restored at start (store down?): kept, retried on
        # the next start or the next mount of that name.
        self.failed: dict[str, list[str]] = {}
        self._lock = trio.Lock()

    # -- persistence ----------------------------------------------------------------------

    def _records(self) -> list[dict[str, Any]]:
        served = [{"name": i.name, "layers": i.layers} for i in self.fs.images()]
        return served + [{"name": n, "layers": ls} for n, ls in sorted(self.failed.items())]

    def _save(self) -> None:
        doc = {"version": 1, "mounts": self._records()}
        atomic_write(self.paths.mounts, json.dumps(doc, indent=1).encode())

    async def restore(self) -> None:
        try:
            doc = json.loads(self.paths.mounts.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("ignoring unreadable %s: %s", self.paths.mounts, exc)
            return
        for rec in doc.get("mounts", []):
            try:
                await self.mount(rec["name"], rec["layers"], save=False)
                log.info("restored %s", rec["name"])
            except Exception as exc:
                log.error("cannot restore %s: %s", rec.get("name"), exc)
                if isinstance(rec.get("name"), str) and isinstance(rec.get("layers"), list):
                    self.failed[rec["name"]] = rec["layers"]

    # -- operations -----------------------------------------------------------------------

    def _describe(self, name: str) -> dict[str, Any]:
        image = self.fs.get(name)
        assert image is not None
        return {
            "name": name,
            "layers": image.layers,
            "path": str(self.paths.image(name)),
            "size": image.size,
        }

    async def mount(self, name: Any, layers: Any, save: bool = True) -> dict[str, Any]:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise RequestError("bad_request", f"bad image name {name!r}")
        if (
            not isinstance(layers, list)
            or not layers
            or not all(isinstance(x, str) and LAYER_RE.fullmatch(x) for x in layers)
        ):
            raise RequestError("bad_request", "layers must be a non-empty list of layer ids")
        existing = self.fs.get(name)
        if existing is not None:
            if existing.layers != layers:
                raise RequestError("conflict", f"{name} is already served with other layers")
            return self._describe(name)
        stack = await trio.to_thread.run_sync(load_stack, self.store, self.paths.indexes, layers)
        async with self._lock:
            existing = self.fs.get(name)
            if existing is not None and existing.layers != layers:
                raise RequestError("conflict", f"{name} is already served with other layers")
            if existing is None:
                self.fs.add(name, layers, stack)
            self.failed.pop(name, None)
            if save:
                self._save()
        return self._describe(name)

    async def unmount(self, name: Any) -> dict[str, Any]:
        if not isinstance(name, str):
            raise RequestError("bad_request", "name must be a string")
        async with self._lock:
            found = self.fs.remove(name) is not None or self.failed.pop(name, None) is not None
            if found:
                self._save()
        return {"existed": found}

    async def prefetch(self, name: Any) -> dict[str, Any]:
        image = self.fs.get(name) if isinstance(name, str) else None
        if image is None:
            raise RequestError("not_found", f"{name!r} is not mounted")
        digests = await trio.to_thread.run_sync(chunks_in_order, image.stack)
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is not None:
            await trio.to_thread.run_sync(prefetch, digests)
        return {"chunks": len(digests)}

    async def stats(self) -> dict[str, Any]:
        get = getattr(self.source, "stats", None)
        cache = await trio.to_thread.run_sync(get) if get is not None else None
        if dataclasses.is_dataclass(cache) and not isinstance(cache, type):
            cache = dataclasses.asdict(cache)
        fs = {"reads": self.fs.reads, "read_bytes": self.fs.read_bytes}
        fs["read_errors"] = self.fs.read_errors
        return {"cache": cache, "fs": fs}

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "mnt": str(self.paths.mnt),
            "mounts": [self._describe(i.name) for i in self.fs.images()],
            "failed": [{"name": n, "layers": ls} for n, ls in sorted(self.failed.items())],
        }

    async def handle(self, req: Any) -> dict[str, Any]:
        if not isinstance(req, dict):
            raise RequestError("bad_request", "a request is a JSON object")
        op = req.get("op")
        if op == "status":
            return self.status()
        if op == "mount":
            return await self.mount(req.get("name"), req.get("layers"))
        if op == "unmount":
            return await self.unmount(req.get("name"))
        if op == "prefetch":
            return await self.prefetch(req.get("name"))
        if op == "stats":
            return await self.stats()
        raise RequestError("bad_request", f"unknown op {op!r}")

    # -- control socket -------------------------------------------------------------------

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            return {"ok": True, **await self.handle(json.loads(line))}
        except RequestError as exc:
            return {"ok": False, "code": exc.code, "error": str(exc)}
        except ValueError as exc:
            return {"ok": False, "code": "bad_request", "error": str(exc)}
        except Exception as exc:
            log.exception("request failed: %r", line[:200])
            return {"ok": False, "code": "failed", "error": f"{type(exc).__name__}: {exc}"}

    async def _connection(self, stream: trio.SocketStream) -> None:
        buf = b""
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        answer = json.dumps(await self._answer(line)).encode() + b"\n"
                        try:
                            await stream.send_all(answer)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            return
                if len(buf) > MAX_LINE:
                    return

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        path = self.paths.socket
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead daemon's socket; we hold the daemon lock
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(path))
        os.chmod(path, 0o600)
        sock.listen(64)
        listener = trio.SocketListener(sock)
        task_status.started()
        await trio.serve_listeners(self._connection, [listener])


async def _watch_signals(nursery: trio.Nursery) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: unmounting and exiting", signum)
            pyfuse3.terminate()
            nursery.cancel_scope.cancel()
            return


async def _run(daemon: Daemon) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, nursery)

        async def fuse_main() -> None:
            await pyfuse3.main(min_tasks=4, max_tasks=64)
            log.info("FUSE loop ended")
            nursery.cancel_scope.cancel()

        nursery.start_soon(fuse_main)
        # The kernel sets the mount's read-ahead when INIT is answered; a stat() of the
        # root returns after that, so raise it only then.
        await trio.to_thread.run_sync(os.stat, daemon.paths.mnt)
        _set_read_ahead(daemon.paths.mnt, READ_AHEAD_KB)
        await daemon.restore()
        await nursery.start(daemon.serve)
        log.info("serving %d image(s) at %s", len(daemon.fs.images()), daemon.paths.mnt)


def _unmount(mnt: Path) -> None:
    with contextlib.suppress(Exception):
        pyfuse3.close(unmount=True)
    for cmd in (["fusermount3", "-u", str(mnt)], ["umount", "-l", str(mnt)]):
        if not is_mounted(mnt):
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(cmd, capture_output=True, timeout=30)
    if is_mounted(mnt):
        log.error("%s is still mounted", mnt)


def run_daemon(cfg: Config, source: ChunkSource | None = None) -> int:
    """Run the daemon for `cfg.home` until SIGTERM; 3 if another one already runs there."""
    paths = BlockdPaths.for_home(cfg.home)
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    lock_fd = os.open(paths.daemon_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.error("another block daemon already serves %s", paths.root)
        os.close(lock_fd)
        return 3
    os.ftruncate(lock_fd, 0)
    os.write(lock_fd, f"{os.getpid()}\n".encode())
    from ..stores import open_chunk_cache, open_object_store

    store = open_object_store(cfg)
    if source is None:
        source = open_chunk_cache(cfg, store)
    daemon = Daemon(paths, store, source)
    cleanup_stale_mount(paths.mnt)
    paths.mnt.mkdir(exist_ok=True)
    try:
        pyfuse3.init(daemon.fs, str(paths.mnt), mount_options())
    except BaseException:
        # No session to close (pyfuse3.close would touch a null one); just the mount.
        cleanup_stale_mount(paths.mnt)
        raise
    try:
        trio.run(_run, daemon)
    finally:
        _unmount(paths.mnt)
        with contextlib.suppress(FileNotFoundError):
            paths.socket.unlink()
        close = getattr(source, "close", None)
        if close is not None:
            close()
        log.info("stopped")
        os.close(lock_fd)
    return 0
