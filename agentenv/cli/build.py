"""`aenv build -f Dockerfile --name N`: a template built from a Dockerfile's steps, with the
build's log as it runs (the same API the E2B SDKs' `Template.build` uses)."""

from __future__ import annotations

import argparse
import hashlib
import io
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx

from ..errors import AenvError
from ..images.dockerfile import CopySource, parse_dockerfile
from .context import CliError, Context

POLL_SECONDS = 0.5


def files_archive(context: Path, copy: CopySource) -> tuple[str, bytes]:
    """(hash, gzipped tar) of what `copy.src` matches under `context`, by context-relative
    path; the hash covers the paths, modes and contents, and the destination."""
    matches = sorted(context.glob(copy.src)) if any(c in copy.src for c in "*?[") else []
    if not matches:
        single = context / copy.src
        if not (single.exists() or single.is_symlink()):
            raise CliError(f"COPY {copy.src}: nothing in {context} matches it")
        matches = [single]
    digest = hashlib.sha256(f"COPY {copy.src} {copy.dest}".encode())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for match in matches:
            resolved = match.resolve() if not match.is_symlink() else match.parent.resolve()
            if not resolved.is_relative_to(context.resolve()):
                raise CliError(f"COPY {copy.src}: {match} is outside the build context")
            for path in [match, *sorted(match.rglob("*"))] if match.is_dir() else [match]:
                relative = path.relative_to(context).as_posix()
                info = archive.gettarinfo(str(path), arcname=relative)
                digest.update(f"{relative}:{info.mode}:{info.size}:{info.linkname}".encode())
                if info.isfile():
                    data = path.read_bytes()
                    digest.update(data)
                    archive.addfile(info, io.BytesIO(data))
                else:
                    archive.addfile(info)
    return digest.hexdigest(), buffer.getvalue()


def cmd_build(ctx: Context, args: argparse.Namespace) -> int:
    dockerfile = Path(args.file)
    try:
        text = dockerfile.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {dockerfile}: {exc.strerror}") from None
    try:
        recipe = parse_dockerfile(text)
    except AenvError as exc:
        raise CliError(f"{dockerfile}: {exc.message}") from None
    for note in recipe.notes:
        ctx.warn(note)
    context = Path(args.context) if args.context else dockerfile.resolve().parent
    archives: dict[str, bytes] = {}
    copies = iter(recipe.copies)
    for step in recipe.steps:
        if step["type"] == "COPY":
            files_hash, data = files_archive(context, next(copies))
            step["filesHash"] = files_hash
            archives[files_hash] = data
    with ctx.api() as api:
        request: dict[str, Any] = {"name": args.name}
        if args.cpu:
            request["cpuCount"] = args.cpu
        if args.memory:
            request["memoryMB"] = args.memory
        if args.min_free_disk is not None:
            request["minFreeDiskMb"] = args.min_free_disk
        registered = api.post_json("/v3/templates", request)
        template_id, build_id = registered["templateID"], registered["buildID"]
        ctx.warn(f"building {template_id} (build {build_id})")
        for files_hash, data in archives.items():
            link = api.call_json("GET", f"/templates/{template_id}/files/{files_hash}")
            if not link.get("present"):
                _upload(link["url"], data)
        start: dict[str, Any] = {"steps": recipe.steps, "force": bool(args.no_cache)}
        if recipe.from_template:
            start["fromTemplate"] = recipe.from_template
        else:
            start["fromImage"] = recipe.from_image
        if recipe.start_cmd:
            start["startCmd"] = recipe.start_cmd
        if args.ready_cmd:
            start["readyCmd"] = args.ready_cmd
        api.post_json(f"/v2/templates/{template_id}/builds/{build_id}", start)
        status = _follow(ctx, api, template_id, build_id)
    if status["status"] != "ready":
        raise CliError(status.get("reason", {}).get("message", "the build failed"))
    ctx.stdout.write(f"{template_id}\n")
    return 0


def _upload(url: str, data: bytes) -> None:
    """PUT to the signed URL, as the SDKs do (no API key: the URL is the credential)."""
    response = httpx.put(url, content=data, timeout=httpx.Timeout(600.0, connect=10.0))
    if response.status_code >= 300:
        raise CliError(f"uploading build files failed: {response.status_code} {response.text}")


def _follow(ctx: Context, api: Any, template_id: str, build_id: str) -> dict[str, Any]:
    """Print the build's log lines as they come; its final status."""
    offset = 0
    while True:
        status = api.call_json(
            "GET", f"/templates/{template_id}/builds/{build_id}/status?logsOffset={offset}"
        )
        for entry in status["logEntries"]:
            ctx.stderr.write(f"{entry['message']}\n")
        offset += len(status["logEntries"])
        if status["status"] in ("ready", "error") and not status["logEntries"]:
            return status
        ctx.stderr.flush()
        time.sleep(POLL_SECONDS)
