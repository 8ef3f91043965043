"""`aenv pull`, `aenv template ls|rm` and `aenv gc` (what the object store keeps)."""

from __future__ import annotations

import argparse

from ..images.progress import parse_byte_progress
from .context import CliError, Context
from .output import print_json, render_table


def _bar(done: int, size: int, width: int = 30) -> str:
    filled = width * done // size if size else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done / 2**20:7.1f}/{size / 2**20:.1f} MiB"


def cmd_pull(ctx: Context, args: argparse.Namespace) -> int:
    """Pull an OCI image into a template, drawing a bar per layer download on a TTY."""
    tty = ctx.stderr.isatty()
    drawing = False
    with ctx.api() as api:
        for event in api.pull(args.image, args.name):
            if "progress" in event:
                line = event["progress"]
                counter = parse_byte_progress(line)
                if counter and tty:
                    ctx.stderr.write(f"\r{counter.label} {_bar(counter.done, counter.total)}")
                    ctx.stderr.flush()
                    drawing = True
                    continue
                if counter:
                    continue  # byte counts only make sense as a bar
                if drawing:
                    ctx.stderr.write("\n")
                    drawing = False
                ctx.warn(line)
            elif "error" in event:
                raise CliError(event["error"].get("message", "pull failed"))
            elif "template" in event:
                if drawing:
                    ctx.stderr.write("\n")
                ctx.stdout.write(event["template"]["templateID"] + "\n")
                return 0
    raise CliError("the server ended the pull without a result")


def cmd_template_ls(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.api() as api:
        items = api.list_templates()
    if (args.output or ("table" if ctx.stdout.isatty() else "json")) == "json":
        print_json(items, ctx.stdout)
        return 0
    rows = [
        [t["templateID"], str(t.get("source", "")), str(t.get("diskSizeMB", "")),
         str(len(t.get("layers", [])))]
        for t in items
    ]  # fmt: skip
    ctx.stdout.write(render_table(("TEMPLATE", "SOURCE", "DISK MB", "LAYERS"), rows))
    return 0


def cmd_template_rm(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.api() as api:
        for template_id in args.ids:
            api.delete_template(template_id)
            ctx.stdout.write(template_id + "\n")
    return 0


def cmd_gc(ctx: Context, args: argparse.Namespace) -> int:
    """Collect unreferenced layers and chunks; print what was deleted and kept."""
    with ctx.api() as api:
        print_json(api.collect_garbage(args.grace), ctx.stdout)
    return 0
