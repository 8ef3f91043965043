"""The server's side of the block daemon: start it once per home and send it requests.

Blocking on purpose (the server calls it through `asyncio.to_thread`); every request opens
its own connection, so one client may be used from several threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentenv.config import Config
from agentenv.errors import DependencyFailed

from .common import BlockdPaths, atomic_write, cleanup_stale_mount, config_to_json

# Errors meaning "no daemon answers on the socket" (as opposed to a refused request).
_UNREACHABLE = (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError)


class BlockdError(DependencyFailed):
    """The daemon refused a request or could not be reached; `code` says which. A client
    gets 503."""

    part = "the block daemon"

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code


class BlockdClient:
    """Talks to the block daemon of `cfg.home`, starting it when none answers."""

    def __init__(
        self, cfg: Config, start_timeout: float = 30.0, request_timeout: float = 300.0
    ) -> None:
        self.cfg = cfg
        self.paths = BlockdPaths.for_home(cfg.home)
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    # -- requests -------------------------------------------------------------------------

    def request(self, req: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request and return the answer; BlockdError if it is refused."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout or self.request_timeout)
            sock.connect(str(self.paths.socket))
            sock.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                data = sock.recv(65536)
                if not data:
                    raise ConnectionResetError("the block daemon closed the connection")
                buf += data
        answer: dict[str, Any] = json.loads(buf)
        if not answer.pop("ok", False):
            raise BlockdError(answer.get("error", "request failed"), answer.get("code", "failed"))
        return answer

    def _call(self, req: dict[str, Any]) -> dict[str, Any]:
        # A daemon that died (or was never started) is started and asked again, once.
        try:
            return self.request(req)
        except _UNREACHABLE:
            self.ensure_running()
            return self.request(req)

    def try_status(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The daemon's status, or None when none answers."""
        try:
            return self.request({"op": "status"}, timeout=timeout)
        except (OSError, ValueError):
            return None

    def status(self) -> dict[str, Any]:
        return self._call({"op": "status"})

    def try_stats(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The daemon's counters (its chunk cache's, its reads), or None when none answers."""
        try:
            return self.request({"op": "stats"}, timeout=timeout)
        except (OSError, ValueError):
            return None

    def mount(self, name: str, layers: list[str]) -> tuple[Path, int]:
        """Serve the stack `layers` (bottom to top) as `<mnt>/<name>.img`: (path, size)."""
        answer = self._call({"op": "mount", "name": name, "layers": list(layers)})
        return Path(answer["path"]), int(answer["size"])

    def unmount(self, name: str) -> bool:
        """Stop serving `name` (open files keep working); whether it was served."""
        return bool(self._call({"op": "unmount", "name": name})["existed"])

    def prefetch(self, name: str) -> int:
        """Queue every chunk of `name` on the cache's background fetcher; how many."""
        return int(self._call({"op": "prefetch", "name": name})["chunks"])

    def stats(self) -> dict[str, Any]:
        return self._call({"op": "stats"})

    # -- process ----------------------------------------------------------------------------

    def ensure_running(self) -> int:
        """Make sure a daemon serves this home; its pid. Never starts a second one."""
        status = self.try_status()
        if status is not None:
            return int(status["pid"])
        self.paths.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        fd = os.open(self.paths.spawn_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BlockdError("timed out waiting for another blockd start") from None
                    time.sleep(0.05)
            # Another client may have started it while we waited for the lock.
            status = self.try_status()
            if status is not None:
                return int(status["pid"])
            return self._spawn(deadline)
        finally:
            os.close(fd)  # releases the lock

    def _spawn(self, deadline: float) -> int:
        atomic_write(self.paths.config, config_to_json(self.cfg), mode=0o600)
        with open(self.paths.log, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agentenv.storage.blockd", "--home", str(self.cfg.home)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a signal to the server's process group does not reach it.
                start_new_session=True,
                cwd="/",
            )
        self._proc = proc
        while time.monotonic() < deadline:
            status = self.try_status(timeout=2.0)
            if status is not None:
                return int(status["pid"])
            code = proc.poll()
            # 3: a daemon started by hand holds the home; wait for it to answer instead.
            if code is not None and code != 3:
                raise BlockdError(f"blockd exited with {code} at start: {self._log_tail()}")
            time.sleep(0.05)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise BlockdError(f"blockd did not answer within {self.start_timeout}s: {self._log_tail()}")

    def _log_tail(self, n: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.paths.log.read_bytes()[-n:].decode(errors="replace")
        return ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the daemon and wait until it has gone and left no mount (for tests)."""
        status = self.try_status()
        if status is not None:
            pid = int(status["pid"])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not self._wait_gone(pid, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._wait_gone(pid, 10)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=timeout)
        self._proc = None
        cleanup_stale_mount(self.paths.mnt)

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:  # our child: reap it
                    return True
            elif not _alive(pid):
                return True
            time.sleep(0.05)
        return False


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, whose parent has not reaped it yet, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
