"""Command line: ``python -m aenv_agent --host 0.0.0.0 --port PORT --rootfs /rootfs``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys

from .server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aenv_agent", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (envd's)")
    parser.add_argument(
        "--rootfs", default="/", help="the user's root filesystem (processes are chrooted there)"
    )
    parser.add_argument(
        "--guest",
        action="store_true",
        help="run as a VM's agent: /init mounts the user's disk at --rootfs, sets the clock",
    )
    parser.add_argument(
        "--init-secret-file",
        help="outside a VM: the file holding the host's /init secret (else /init is refused)",
    )
    parser.add_argument("--log-level", default="INFO", help="stderr log level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s aenv-agent %(levelname)s %(message)s",
    )
    if not os.path.isdir(args.rootfs):
        parser.error(f"--rootfs {args.rootfs} is not a directory")

    async def run() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            # Cancel the server task so aiohttp's cleanup runs, then exit normally.
            loop.add_signal_handler(signum, task.cancel)  # type: ignore[union-attr]
        await serve(args.host, args.port, args.rootfs, args.guest, args.init_secret_file)

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
