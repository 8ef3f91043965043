"""User processes: spawn inside the rootfs as a user, pump output, fan it out, reap the exit.

A process belongs to the :class:`ProcessTable`, not to the RPC stream that started it, so it
outlives client disconnects. Output is read by event-loop callbacks that never block: every
subscriber has its own queue, and one that falls too far behind is dropped instead of
stalling the process or the other subscribers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import logging
import os
import pty
import signal
import struct
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .users import User

log = logging.getLogger("aenv_agent.process")

PIPE_CHUNK = 32 * 1024
PTY_CHUNK = 16 * 1024
SUBSCRIBER_LIMIT = 64 * 1024 * 1024  # queued bytes before a slow subscriber is dropped
EOF_GRACE = 1.0  # after exit, how long to wait for grandchildren to release the pipes

# Go's syscall.Signal strings, which envd puts in "status" ("signal: killed").
SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
}

OVERFLOW = object()  # queued to a subscriber that was dropped for being too slow


@dataclass(eq=False)  # identity hashing: subscribers live in a set
class Subscriber:
    """One reader of a process's events (a Start or Connect stream)."""

    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    pending: int = 0


@dataclass
class SpawnSpec:
    """Everything needed to start one process."""

    cmd: str
    args: list[str]
    env: dict[str, str]
    cwd: str  # guest path, checked to exist
    user: User
    rootfs: str
    pty_size: tuple[int, int] | None = None  # (cols, rows)
    stdin: bool = False


def _child_setup(spec: SpawnSpec) -> Callable[[], None]:
    """The preexec function: enter the rootfs, then the cwd, then drop to the user."""
    root, cwd, user, use_pty = spec.rootfs, spec.cwd, spec.user, spec.pty_size is not None

    def setup() -> None:
        if root != "/":
            os.chroot(root)
        os.chdir(cwd)
        if use_pty:
            # setsid() already ran (start_new_session); make the pty our controlling tty.
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if os.geteuid() == 0:
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)

    return setup


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def exit_event(returncode: int, deadline: bool) -> dict[str, Any]:
    """The EndEvent for a finished process, with proto3 defaults left out."""
    if returncode >= 0:
        end: dict[str, Any] = {"exited": True, "status": f"exit status {returncode}"}
        if returncode:
            end["exitCode"] = returncode
            end["error"] = end["status"]
    else:
        name = SIGNAL_NAMES.get(-returncode, f"signal {-returncode}")
        end = {"exitCode": -1, "status": f"signal: {name}", "error": f"signal: {name}"}
    if deadline:
        end["error"] = "context deadline exceeded"
    return {"event": {"end": end}}


class ManagedProcess:
    """A running user process and the fds the agent holds for it."""

    def __init__(self, spec: SpawnSpec, config: dict[str, Any], tag: str | None) -> None:
        self.spec = spec
        self.config = config
        self.tag = tag
        self.subscribers: set[Subscriber] = set()
        self.deadline_hit = False
        self.done = asyncio.Event()
        self.stdin_fd: int | None = None
        self.pty_fd: int | None = None
        self._outputs: dict[int, str] = {}  # fd -> "stdout" | "stderr" | "pty"
        self._eof = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self.popen = self._spawn()
        self.pid = self.popen.pid

    def _spawn(self) -> subprocess.Popen[bytes]:
        spec = self.spec
        child_fds: list[int] = []
        try:
            if spec.pty_size:
                master, slave = pty.openpty()
                set_winsize(slave, *spec.pty_size)
                self.pty_fd = master
                child_fds.append(slave)
                stdin = stdout = stderr = slave
                self._outputs[master] = "pty"
            else:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                child_fds += [out_w, err_w]
                self._outputs[out_r] = "stdout"
                self._outputs[err_r] = "stderr"
                stdout, stderr = out_w, err_w
                stdin = subprocess.DEVNULL
                if spec.stdin:
                    in_r, in_w = os.pipe()
                    child_fds.append(in_r)
                    self.stdin_fd = in_w
                    stdin = in_r
            popen = subprocess.Popen(
                [spec.cmd, *spec.args],
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=spec.env,
                preexec_fn=_child_setup(spec),
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            for fd in [*self._outputs, self.stdin_fd]:
                if fd is not None:
                    os.close(fd)
            self._outputs.clear()
            self.stdin_fd = self.pty_fd = None
            raise
        finally:
            for fd in child_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for fd in [*self._outputs, self.stdin_fd]:
            if fd is not None:
                os.set_blocking(fd, False)
        for fd in self._outputs:
            self._loop.add_reader(fd, self._on_readable, fd)
        return popen

    # -- output -----------------------------------------------------------------------------

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        self.subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def publish(self, event: dict[str, Any], size: int = 0) -> None:
        for sub in list(self.subscribers):
            if sub.pending + size > SUBSCRIBER_LIMIT:
                self.subscribers.discard(sub)
                sub.queue.put_nowait(OVERFLOW)
                continue
            sub.pending += size
            sub.queue.put_nowait((event, size))

    def _on_readable(self, fd: int) -> None:
        kind = self._outputs[fd]
        try:
            data = os.read(fd, PTY_CHUNK if kind == "pty" else PIPE_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # EIO on a pty master once every slave holder has gone
        if not data:
            self._close_output(fd)
            return
        if self.subscribers:
            self._publish_data(kind, data)

    def _publish_data(self, kind: str, data: bytes) -> None:
        encoded = base64.b64encode(data).decode()
        self.publish({"event": {"data": {kind: encoded}}}, len(data))

    def _close_output(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        del self._outputs[fd]
        if fd == self.pty_fd:
            self.pty_fd = None
        os.close(fd)
        if not self._outputs:
            self._eof.set()

    def _drain_and_close(self) -> None:
        """Read what is already buffered, then drop the pipes a grandchild may still hold."""
        for fd in list(self._outputs):
            while fd in self._outputs:
                try:
                    data = os.read(fd, PIPE_CHUNK)
                except OSError:  # EAGAIN: nothing buffered; EIO: pty closed
                    data = b""
                if not data:
                    self._close_output(fd)
                elif self.subscribers:
                    self._publish_data(self._outputs[fd], data)

    # -- input and control --------------------------------------------------------------------

    async def write_input(self, data: bytes, to_pty: bool) -> None:
        fd = self.pty_fd if to_pty else self.stdin_fd
        if fd is None:
            what = "pty" if to_pty else "stdin (start the process with stdin enabled)"
            raise LookupError(f"process {self.pid} has no open {what}")
        async with self._write_lock:
            view = memoryview(data)
            while view:
                try:
                    written = os.write(fd, view)
                    view = view[written:]
                except BlockingIOError:
                    ready = self._loop.create_future()
                    self._loop.add_writer(fd, ready.set_result, None)
                    try:
                        await ready
                    finally:
                        self._loop.remove_writer(fd)

    def close_stdin(self) -> None:
        if self.stdin_fd is not None:
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def signal(self, signum: int) -> None:
        """Signal the whole process group, so ``bash -c`` children go too."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def kill_for_deadline(self) -> None:
        self.deadline_hit = True
        self.signal(signal.SIGKILL)

    def resize(self, cols: int, rows: int) -> None:
        if self.pty_fd is None:
            raise LookupError(f"process {self.pid} has no pty")
        set_winsize(self.pty_fd, cols, rows)

    # -- exit ---------------------------------------------------------------------------------

    async def wait_exit(self) -> int:
        """Reap the child without threads via a pidfd (falls back to a thread)."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            return await asyncio.get_running_loop().run_in_executor(None, self.popen.wait)
        try:
            while (code := self.popen.poll()) is None:
                ready = self._loop.create_future()
                self._loop.add_reader(pidfd, ready.set_result, None)
                try:
                    await ready
                finally:
                    self._loop.remove_reader(pidfd)
            return code
        finally:
            os.close(pidfd)

    async def supervise(self) -> None:
        """Wait for exit and output EOF, publish the end event, release everything."""
        try:
            code = await self.wait_exit()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._eof.wait(), EOF_GRACE)
            self._drain_and_close()
            self.close_stdin()
            self.publish(exit_event(code, self.deadline_hit))
        finally:
            for fd in list(self._outputs):
                self._close_output(fd)
            self.close_stdin()
            self.done.set()


class ProcessTable:
    """All running processes, by pid; finished ones are removed at once."""

    def __init__(self) -> None:
        self.procs: dict[int, ManagedProcess] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self,
        spec: SpawnSpec,
        config: dict[str, Any],
        tag: str | None,
        deadline: float | None,
    ) -> tuple[ManagedProcess, Subscriber]:
        proc = ManagedProcess(spec, config, tag)
        sub = proc.subscribe()  # before any output can be read: nothing is lost
        self.procs[proc.pid] = proc
        timer = None
        if deadline is not None:
            timer = asyncio.get_running_loop().call_later(deadline, proc.kill_for_deadline)
        task = asyncio.get_running_loop().create_task(self._run(proc, timer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        command = " ".join([str(config.get("cmd", "")), *map(str, config.get("args") or [])])
        fields = {"pid": proc.pid, "cmd": command, "tag": tag or ""}
        log.info("process started", extra={"fields": fields})
        return proc, sub

    async def _run(self, proc: ManagedProcess, timer: asyncio.TimerHandle | None) -> None:
        try:
            await proc.supervise()
        finally:
            if timer:
                timer.cancel()
            self.procs.pop(proc.pid, None)
            fields = {"pid": proc.pid, "exitCode": proc.popen.returncode}
            log.info("process ended", extra={"fields": fields})

    def find(self, selector: dict[str, Any]) -> ManagedProcess | None:
        if "pid" in selector:
            try:
                return self.procs.get(int(selector["pid"]))
            except (TypeError, ValueError):
                return None
        tag = selector.get("tag")
        return next((p for p in self.procs.values() if tag and p.tag == tag), None)

    async def shutdown(self) -> None:
        """Stop supervising (processes are left running; the VM is going away anyway)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
