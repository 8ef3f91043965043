"""The base template: a Debian root filesystem for sandboxes, like E2B's `base` template."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentenv.config import Config
from agentenv.guest.buildutil import KitBuildError, Progress, locked, remove_tree, run, step
from agentenv.guest.debootstrap import clean_tree, debootstrap
from agentenv.guest.ext4 import pack_ext4
from agentenv.guest.kit import ROOTFS_LABEL
from agentenv.images.builtimage import ROOTFS, current_manifest, inputs_version, publish

__all__ = ["BaseTemplate", "build_base_template", "load_base_template"]

# Bump when the builder's output changes for the same inputs.
BASE_FORMAT = 1
# What agents reach for in E2B's base image: a shell and core tools, Python with pip and
# venv (`python` too), git, curl and wget.
BASE_PACKAGES = (
    "bash",
    "coreutils",
    "procps",
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "git",
    "ca-certificates",
    "sudo",
    "curl",
    "wget",
    "iproute2",
    "less",
)
USER, UID, HOSTNAME = "user", 1000, "sandbox"
HOSTS = f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"


@dataclass(frozen=True)
class BaseTemplate:
    """The base root filesystem image (ext4, label aenv-rootfs) and its content hash."""

    rootfs: Path
    version: str


def base_dir(cfg: Config) -> Path:
    return cfg.images_dir / "base"


def base_inputs(cfg: Config) -> dict[str, object]:
    """Everything the template's content depends on."""
    return {
        "format": BASE_FORMAT,
        "mirror": cfg.kit.mirror,
        "suite": cfg.kit.suite,
        "packages": list(BASE_PACKAGES),
        "user": [USER, UID],
        "hostname": HOSTNAME,
        "size_mb": cfg.sandbox.disk_size_mb,
    }


def base_version(cfg: Config) -> str:
    """Content hash of the template's inputs."""
    return inputs_version(base_inputs(cfg))


def load_base_template(cfg: Config) -> BaseTemplate | None:
    """The built template if it matches the current inputs, else None."""
    directory, version = base_dir(cfg), base_version(cfg)
    if current_manifest(directory, version) is None:
        return None
    return BaseTemplate(rootfs=directory / ROOTFS, version=version)


def build_base_template(
    cfg: Config, *, force: bool = False, progress: Progress = print
) -> BaseTemplate:
    """Build `images_dir/base/rootfs.ext4` unless it is current; returns it either way."""
    directory = base_dir(cfg)
    directory.mkdir(parents=True, exist_ok=True)
    with locked(directory / ".build.lock"):
        current = load_base_template(cfg)
        if current is not None and not force:
            progress(f"base template {current.version} is up to date in {directory}")
            return current
        version = base_version(cfg)
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=directory))
        try:
            tree = work / "rootfs"
            debootstrap(tree, BASE_PACKAGES, cfg, progress)
            with step(progress, "configuring base template"):
                configure_tree(tree)
            image = work / "rootfs.ext4"
            pack_ext4(tree, image, cfg.sandbox.disk_size_mb, ROOTFS_LABEL, progress)
            manifest = {"version": version, "inputs": base_inputs(cfg), "built_at": time.time()}
            rootfs = publish(directory, image, manifest, work)
        finally:
            remove_tree(work)
        progress(f"base template {version} built in {time.monotonic() - t0:.1f}s")
        return BaseTemplate(rootfs=rootfs, version=version)


def configure_tree(tree: Path) -> None:
    """Add the sandbox user with passwordless sudo, hostname and hosts; drop build leftovers."""
    if not (tree / "usr/bin/sudo").exists():
        raise KitBuildError("base template: sudo missing from the tree")
    run(
        f"create user {USER}",
        ["chroot", tree, "useradd", "--create-home", "--uid", str(UID), "--user-group",
         "--groups", "sudo", "--shell", "/bin/bash", USER],
    )  # fmt: skip
    sudoers = tree / "etc/sudoers.d" / USER
    sudoers.write_text(f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    (tree / "etc/hostname").write_text(HOSTNAME + "\n")
    (tree / "etc/hosts").write_text(HOSTS)
    clean_tree(tree, docs=False, locales=False)
    shutil.rmtree(tree / "debootstrap", ignore_errors=True)
    for sub in ("proc", "sys", "dev", "run"):
        (tree / sub).mkdir(exist_ok=True)
