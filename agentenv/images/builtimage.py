"""A root filesystem image built once per set of inputs into its own directory:
`rootfs.ext4` beside `manifest.json`, which names the inputs' hash and is written last."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ROOTFS = "rootfs.ext4"
MANIFEST = "manifest.json"


def inputs_version(inputs: dict[str, object]) -> str:
    """Content hash of an image's inputs."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def current_manifest(directory: Path, version: str) -> dict[str, Any] | None:
    """The manifest of the image in `directory` if it was built from `version`, else None."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("version") != version or not (directory / ROOTFS).is_file():
        return None
    return manifest


def publish(directory: Path, image: Path, manifest: dict[str, object], work: Path) -> Path:
    """Move a built image into `directory` and its manifest after it: a reader that sees
    the manifest also sees the matching image. Returns the image's final path."""
    (directory / MANIFEST).unlink(missing_ok=True)
    os.replace(image, directory / ROOTFS)
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(work / MANIFEST, directory / MANIFEST)
    return directory / ROOTFS
