"""`aenv snapshot create|ls` and `aenv rollback` (`snapshot rm` is `template rm`)."""

from __future__ import annotations

import argparse

from .context import Context
from .output import print_json, render_table


def cmd_snapshot_create(ctx: Context, args: argparse.Namespace) -> int:
    """Snapshot a running sandbox (it runs on); print the snapshot's id."""
    with ctx.api() as api:
        snapshot = api.create_snapshot(args.id, args.name, memory=not args.filesystem)
    ctx.stdout.write(snapshot["snapshotID"] + "\n")
    return 0


def cmd_snapshot_ls(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.api() as api:
        items = api.list_snapshots(args.sandbox, args.name)
    if (args.output or ("table" if ctx.stdout.isatty() else "json")) == "json":
        print_json(items, ctx.stdout)
        return 0
    rows = [
        [s["snapshotID"], s.get("sandboxID", ""), "full" if s.get("memory") else "filesystem",
         f"{s.get('sizeBytes', 0) / 2**20:.0f}", str(s.get("createdAt", ""))[:19]]
        for s in items
    ]  # fmt: skip
    ctx.stdout.write(render_table(("SNAPSHOT", "SANDBOX", "KIND", "MB", "CREATED"), rows))
    return 0


def cmd_rollback(ctx: Context, args: argparse.Namespace) -> int:
    """Put a running or paused sandbox back to a snapshot in place; it runs afterwards."""
    with ctx.api() as api:
        sandbox = api.rollback(args.id, args.snapshot)
    ctx.stdout.write(sandbox["sandboxID"] + "\n")
    return 0
