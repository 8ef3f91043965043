"""A stand-in for the public Debian-based images E2B's templates start from (python:3.13,
debian:12), which no registry here serves: the base template's tree without `user`, without
sudo (its files and dpkg's record of it) and with pip free to install system-wide (no PEP
668 marker, as in python:3.13), as an image in a local registry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentenv.config import load_config
from agentenv.images.base import build_base_template
from agentenv.images.convert import loop_mount

from ..images.oci_build import LayerBuilder, build_image, build_layer, push_image
from ..images.registry_server import running_registry

REMOVED_PACKAGE = "sudo"


def without_user(text: str) -> bytes:
    """/etc/passwd, group and their shadows without `user`."""
    lines = []
    for line in text.splitlines():
        fields = line.split(":")
        if fields[0] == "user":
            continue
        if len(fields) == 4:  # group and gshadow: members last
            members = [m for m in fields[-1].split(",") if m and m != "user"]
            fields[-1] = ",".join(members)
        lines.append(":".join(fields))
    return ("\n".join(lines) + "\n").encode()


def without_package(status: str, package: str) -> bytes:
    """dpkg's status file without `package`'s stanza."""
    stanzas = status.strip("\n").split("\n\n")
    kept = [s for s in stanzas if f"Package: {package}" not in s.splitlines()]
    return ("\n\n".join(kept) + "\n").encode()


def stripped_layer(root: Path) -> LayerBuilder:
    """Over `root`: `user`, the sudo package and pip's PEP 668 marker gone."""
    info = root / "var/lib/dpkg/info"
    layer = LayerBuilder().whiteout("home/user").opaque("etc/sudoers.d")
    for name in ("passwd", "group"):
        layer.file(f"etc/{name}", without_user((root / "etc" / name).read_text()))
    for name in ("shadow", "gshadow"):
        layer.file(f"etc/{name}", without_user((root / "etc" / name).read_text()), mode=0o640)
    for owned in (info / f"{REMOVED_PACKAGE}.list").read_text().splitlines():
        path = root / owned.lstrip("/")
        if owned != "/." and path.is_file() and not owned.startswith("/etc/sudoers.d/"):
            layer.whiteout(owned)
    for record in info.glob(f"{REMOVED_PACKAGE}.*"):
        layer.whiteout(f"var/lib/dpkg/info/{record.name}")
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        layer.whiteout(str(marker.relative_to(root)))
    status = (root / "var/lib/dpkg/status").read_text()
    return layer.file("var/lib/dpkg/status", without_package(status, REMOVED_PACKAGE))


@contextmanager
def plain_debian_image(workdir: Path) -> Iterator[str]:
    """The stand-in pushed to a registry running under `workdir` until the block ends;
    yields its reference."""
    base = build_base_template(load_config(), progress=lambda _: None)
    mount = workdir / "base-mnt"
    mount.mkdir()
    with loop_mount(base.rootfs, mount, readonly=True) as root:
        debian = build_layer(LayerBuilder.from_dir(root, owner=None), "zstd")
        stripped = build_layer(stripped_layer(root), "gzip")
    with running_registry(workdir / "registry") as registry:
        push_image(registry.url, "demo/plain", "v1", build_image([debian, stripped]))
        yield f"{registry.host}/demo/plain:v1"
