"""File transfer through envd's `/files`: `aenv upload` and `aenv download`."""

from __future__ import annotations

import argparse
import posixpath
from pathlib import Path

from agentenv.cli.context import CliError, Context


def cmd_upload(ctx: Context, args: argparse.Namespace) -> int:
    """Stream a local file to a path in the sandbox."""
    local = Path(args.local)
    if not local.is_file():
        raise CliError(f"{local}: not a regular file", 2)
    with ctx.envd(args.id, user=args.user) as envd:
        entries = envd.upload(local, args.remote)
    remote = entries[0].get("path", args.remote) if entries else args.remote
    ctx.stdout.write(f"{local} -> {args.id}:{remote} ({local.stat().st_size} bytes)\n")
    return 0


def cmd_download(ctx: Context, args: argparse.Namespace) -> int:
    """Stream a file from the sandbox to a local path (a directory keeps the remote name)."""
    local = Path(args.local)
    if local.is_dir():
        name = posixpath.basename(args.remote.rstrip("/"))
        if not name:
            raise CliError(f"cannot derive a file name from {args.remote!r}", 2)
        local = local / name
    if not local.parent.is_dir():
        raise CliError(f"{local.parent}: no such directory", 2)
    with ctx.envd(args.id, user=args.user) as envd:
        size = envd.download(args.remote, local)
    ctx.stdout.write(f"{args.id}:{args.remote} -> {local} ({size} bytes)\n")
    return 0
