"""Build the images the Docker deployment runs, on a host that reaches no registry: a
Debian base made with debootstrap (the kit's .deb cache makes repeats cheap) and
imported, then the aenv image over it.

Run from the repository root: `.venv/bin/python deploy/docker/build.py [--force]`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentenv.config import load_config
from agentenv.guest.debootstrap import clean_tree, debootstrap

REPO = Path(__file__).resolve().parents[2]
BASE = "aenv-debian:bookworm"
IMAGE = "aenv:latest"
HOST_CAS = Path("/usr/local/share/ca-certificates")


def image_exists(name: str) -> bool:
    found = subprocess.run(["docker", "image", "inspect", name], capture_output=True)
    return found.returncode == 0


def build_base() -> None:
    """A minbase Debian tree as a Docker image, with nothing from any registry."""
    cfg = load_config()
    with tempfile.TemporaryDirectory(prefix="aenv-base-") as tmp:
        root = Path(tmp) / "rootfs"
        debootstrap(root, ["ca-certificates"], cfg, lambda line: print(line, flush=True))
        clean_tree(root, docs=True, locales=False)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", BASE], stdin=tar.stdout, check=True)
        if tar.wait() != 0:
            raise SystemExit("tar of the base tree failed")


def build_image() -> None:
    """The aenv image from a context of only what it needs: the package, these scripts,
    and the CA certificates this host's administrator added (a build behind a TLS-
    intercepting proxy then fetches from PyPI as the host does)."""
    with tempfile.TemporaryDirectory(prefix="aenv-image-") as tmp:
        context = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(REPO / name, context / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(REPO / "agentenv", context / "agentenv", ignore=ignore)
        shutil.copytree(REPO / "deploy" / "docker", context / "deploy" / "docker", ignore=ignore)
        (context / "ca").mkdir()
        for cert in sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []:
            shutil.copy(cert, context / "ca" / cert.name)
        subprocess.run(
            ["docker", "build", "-q", "-f", "deploy/docker/Dockerfile", "-t", IMAGE, "."],
            cwd=context,
            check=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--force", action="store_true", help="rebuild the base image too")
    args = parser.parse_args()
    if args.force or not image_exists(BASE):
        build_base()
    build_image()
    print(IMAGE, flush=True)


if __name__ == "__main__":
    sys.exit(main())
