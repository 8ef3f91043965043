"""Debian root trees via debootstrap, shared by the guest kit and the base template."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from agentenv.config import Config
from agentenv.guest.buildutil import KitBuildError, Progress, locked, remove_tree, run, step

# Dropped from trees that never run a package manager or show documentation.
DOC_PATHS = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/lintian")
APT_STATE_PATHS = ("var/lib/apt/lists", "var/cache/apt")


def cache_dir(cfg: Config) -> Path:
    """Downloaded .deb files kept between builds so later runs skip the downloads."""
    return cfg.kit_dir / "cache" / "debs"


def debootstrap(target: Path, packages: Sequence[str], cfg: Config, progress: Progress) -> None:
    """Install a minbase Debian `cfg.kit.suite` tree with `packages` into `target`."""
    if shutil.which("debootstrap") is None:
        raise KitBuildError("debootstrap: not installed (apt-get install debootstrap)")
    cache = cache_dir(cfg)
    cache.mkdir(parents=True, exist_ok=True)
    argv: list[str | Path] = ["debootstrap", "--variant=minbase", f"--cache-dir={cache}"]
    if packages:
        argv.append("--include=" + ",".join(packages))
    argv += [cfg.kit.suite, target, cfg.kit.mirror]
    # One debootstrap at a time per cache: two writers of one .deb could hand out a torn file.
    with locked(cache / ".lock"), step(progress, f"debootstrap {cfg.kit.suite} into {target.name}"):
        try:
            run("debootstrap", argv)
        except KitBuildError as exc:
            log = target / "debootstrap" / "debootstrap.log"
            if log.exists():
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                exc = KitBuildError(f"{exc}\n--- debootstrap.log ---\n{tail}")
            remove_tree(target)
            raise exc from None


def clean_tree(root: Path, *, docs: bool, locales: bool) -> None:
    """Drop apt/debconf state and logs; optionally documentation and translations."""
    paths = list(APT_STATE_PATHS)
    if docs:
        paths += DOC_PATHS
    if locales:
        # C.UTF-8 lives in usr/lib/locale and stays; these are message catalogs.
        paths += ["usr/share/locale", "usr/share/i18n"]
    for rel in paths:
        path = root / rel
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    for partial in ("var/lib/apt/lists/partial", "var/cache/apt/archives/partial"):
        (root / partial).mkdir(parents=True, exist_ok=True)
    for old in (root / "var/cache/debconf").glob("*-old"):
        old.unlink()
    # Logs of the build itself; the directories stay because dpkg and apt expect them.
    for dirpath, _, filenames in os.walk(root / "var/log"):
        for name in filenames:
            log = Path(dirpath, name)
            if log.is_file() and not log.is_symlink():
                log.write_bytes(b"")
    # Empty, so each boot could make its own; absolute symlinks would point at the host's.
    machine_id = root / "etc/machine-id"
    if machine_id.is_file() and not machine_id.is_symlink():
        machine_id.write_text("")
