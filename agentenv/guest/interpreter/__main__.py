"""``python -m aenv_interpreter``: a supervisor that runs the execution service in a child
process and starts it again when it dies; ``--serve`` is that child."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time

from . import PORT
from .server import DEFAULT_CWD, serve

log = logging.getLogger("aenv_interpreter")

PR_SET_CHILD_SUBREAPER = 36
# Restart delays grow while the service keeps dying young, so a broken install does not spin.
FIRST_DELAY, MAX_DELAY, STABLE_AFTER = 0.2, 5.0, 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aenv_interpreter", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=PORT, help="port to listen on")
    parser.add_argument("--cwd", default=DEFAULT_CWD, help="working directory of new contexts")
    parser.add_argument("--serve", action="store_true", help="run the service (no supervisor)")
    parser.add_argument("--log-level", default="INFO", help="stderr log level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s aenv-interpreter %(levelname)s %(message)s",
    )
    if args.serve:
        return _serve(args.host, args.port, args.cwd)
    child = [sys.executable, "-m", __package__ or "aenv_interpreter", "--serve"]
    child += ["--host", args.host, "--port", str(args.port), "--cwd", args.cwd]
    return supervise([*child, "--log-level", args.log_level])


def _serve(host: str, port: int, cwd: str) -> int:
    async def run() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # Cancel the server task so its cleanup shuts the kernels down.
            loop.add_signal_handler(signum, task.cancel)  # type: ignore[union-attr]
        await serve(host, port, cwd)

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(run())
    return 0


def supervise(command: list[str]) -> int:
    """Run the command until SIGTERM, again each time it exits; kernels a dead service left
    behind are killed (they were reparented to us: we are their subreaper)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    delay = FIRST_DELAY
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(command)
        log.info("service started (pid %d)", child.pid)
        code = child.wait()
        _kill_orphans(child.pid)
        if stopping:
            break
        delay = FIRST_DELAY if time.monotonic() - started > STABLE_AFTER else delay
        log.warning("service exited with %s; restarting in %.1f s", code, delay)
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)
    return 0


def _kill_orphans(service_pid: int) -> None:
    """Kill the process groups of our children other than the service (its kernels, which
    jupyter_client starts in sessions of their own), and reap them."""
    me = str(os.getpid())
    for pid in _children(me):
        if pid != service_pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _children(ppid: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        if stat[stat.rindex(")") + 2 :].split()[1] == ppid:
            found.append(int(entry))
    return found


if __name__ == "__main__":
    sys.exit(main())
