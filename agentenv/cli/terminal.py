"""Interactive shells: local terminal in raw mode, remote PTY over `process.Process/*`."""

from __future__ import annotations

import base64
import contextlib
import os
import select
import signal
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from agentenv.cli.client import EnvdClient, ServerUnreachable
from agentenv.cli.context import CliError
from agentenv.cli.process import ProcessResult, ProcessStream
from agentenv.guest.rpc import ConnectError

_BATCH_BYTES = 64 * 1024
_BATCH_WAIT = 0.005  # seconds to wait for more keystrokes before sending a batch
KEEPALIVE_INTERVAL = 60.0


def terminal_size(fd: int) -> dict[str, int]:
    """`{"cols", "rows"}` of the terminal on `fd`, 80x24 if unknown."""
    try:
        size = os.get_terminal_size(fd)
        return {"cols": size.columns or 80, "rows": size.lines or 24}
    except OSError:
        return {"cols": 80, "rows": 24}


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """Put the terminal in raw mode; always restore the previous settings."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def pty_start_request(size: dict[str, int], term: str) -> dict[str, Any]:
    """The `Start` body for an interactive login shell on a PTY."""
    return {
        "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": term}},
        "pty": {"size": size},
    }


class InputPump(threading.Thread):
    """Forward keystrokes (batched) with `SendInput` and window changes with `Update`."""

    def __init__(
        self,
        envd: EnvdClient,
        pid: int,
        stdin_fd: int,
        wake_fd: int,
        keepalive: Callable[[], None] | None = None,
        activity: threading.Event | None = None,
    ) -> None:
        super().__init__(name="aenv-input", daemon=True)
        self._envd = envd
        self._keepalive = keepalive
        self._activity = activity or threading.Event()
        self._last_keepalive = time.monotonic()
        self._pid = pid
        self._stdin_fd = stdin_fd
        self._wake_fd = wake_fd
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        with contextlib.suppress(OSError):  # fds closed under us at teardown
            self._loop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            ready, _, _ = select.select([self._stdin_fd, self._wake_fd], [], [], 0.5)
            if self._wake_fd in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_fd, 512)
                if not self._stopping.is_set():
                    self._call(
                        "process.Process/Update", {"pty": {"size": terminal_size(self._stdin_fd)}}
                    )
            if self._stdin_fd in ready:
                data = self._read_batch()
                if not data:
                    return  # terminal closed
                self._activity.set()
                pty_input = {"pty": base64.b64encode(data).decode()}
                self._call("process.Process/SendInput", {"input": pty_input})
            self._maybe_keepalive()

    def _maybe_keepalive(self) -> None:
        """While the session is in use, keep the sandbox from expiring under it."""
        if self._keepalive is None or time.monotonic() - self._last_keepalive < KEEPALIVE_INTERVAL:
            return
        self._last_keepalive = time.monotonic()
        if self._activity.is_set():
            self._activity.clear()
            with contextlib.suppress(Exception):  # best effort; the server may not support it
                self._keepalive()

    def _read_batch(self) -> bytes:
        data = os.read(self._stdin_fd, 4096)
        while data and len(data) < _BATCH_BYTES:
            ready, _, _ = select.select([self._stdin_fd], [], [], _BATCH_WAIT)
            if not ready:
                break
            more = os.read(self._stdin_fd, 4096)
            if not more:
                break
            data += more
        return data

    def _call(self, method: str, body: dict[str, Any]) -> None:
        try:
            self._envd.unary(method, {"process": {"pid": self._pid}, **body})
        except ServerUnreachable:
            self._stopping.set()
        except (ConnectError, httpx.HTTPError):
            pass  # the process may be gone; the output stream reports how it ended


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def attach_shell(
    envd: EnvdClient,
    *,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    term: str | None = None,
    keepalive: Callable[[], None] | None = None,
) -> ProcessResult | None:
    """Run `bash -i -l` on a remote PTY wired to this terminal until the shell exits.

    `keepalive` is called (from another thread) about once a minute while there is I/O."""
    if not os.isatty(stdin_fd):
        raise CliError(
            "an interactive shell needs a terminal (stdin is not a TTY); use `aenv exec`"
        )
    term = term or os.environ.get("TERM") or "xterm-256color"
    body = pty_start_request(terminal_size(stdin_fd), term)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    input_client = envd.clone()
    pumps: list[InputPump] = []
    activity = threading.Event()

    def on_output(data: bytes) -> None:
        activity.set()
        _write_all(stdout_fd, data)

    def on_start(pid: int) -> None:
        pump = InputPump(input_client, pid, stdin_fd, wake_r, keepalive, activity)
        pumps.append(pump)
        pump.start()

    def on_winch(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.write(wake_w, b"w")

    previous = signal.signal(signal.SIGWINCH, on_winch)
    try:
        with raw_mode(stdin_fd):
            stream = ProcessStream(pty=on_output, on_start=on_start)
            return stream.run(envd.stream("process.Process/Start", body, timeout=None))
    finally:
        signal.signal(signal.SIGWINCH, previous)
        for pump in pumps:
            pump.stop()
        with contextlib.suppress(OSError):
            os.write(wake_w, b"x")
        for pump in pumps:
            pump.join(timeout=1.0)
        input_client.close()
        os.close(wake_r)
        os.close(wake_w)
