"""A Debian and PyPI mirror for template builds that must not reach the internet: the
.debs and wheels the kit build downloaded, served over HTTP from a namespace host that
stands in for the internet (`netlab.peer`)."""

from __future__ import annotations

import email.utils
import hashlib
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agentenv.config import Config
from agentenv.guest.debootstrap import cache_dir
from agentenv.images.codeinterpreter import downloads_dir

from .netlab import peer, random_slash30

PORT = 8080


@dataclass(frozen=True)
class Mirror:
    """Where a guest finds the mirror: `url` serves `debian/` (a flat apt repository) and
    `wheels/` (a directory pip's `--find-links` reads)."""

    url: str

    @property
    def apt_source(self) -> str:
        """The sources.list line; unsigned, so `trusted=yes`."""
        return f"deb [trusted=yes] {self.url}/debian ./"

    @property
    def wheels(self) -> str:
        return f"{self.url}/wheels/"

    @property
    def pip_env(self) -> dict[str, str]:
        """pip's settings for installing from the mirror alone (never PyPI)."""
        host = self.url.split("//", 1)[1].split(":", 1)[0]
        return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": self.wheels, "PIP_TRUSTED_HOST": host}

    @property
    def apt_setup(self) -> str:
        """Shell that points apt at the mirror alone (never Debian's servers)."""
        return (
            f"rm -f /etc/apt/sources.list.d/* && echo '{self.apt_source}' > /etc/apt/sources.list"
        )


def kit_packages(cfg: Config) -> tuple[list[Path], list[Path]]:
    """The .debs (the base tree's and the code interpreter's) and wheels the kit build
    keeps; a name in both places is taken once."""
    debs: dict[str, Path] = {}
    for directory in (cache_dir(cfg), downloads_dir(cfg) / "apt"):
        for deb in sorted(directory.glob("*.deb")):
            debs.setdefault(deb.name, deb)
    wheels = sorted((downloads_dir(cfg) / "wheels").glob("*.whl"))
    return list(debs.values()), wheels


def flat_repository(debs: Iterable[Path], into: Path) -> None:
    """`debs` linked into `into` with the Packages index and Release file apt reads from
    a flat repository (`deb ... ./`)."""
    into.mkdir(parents=True, exist_ok=True)
    stanzas = []
    for deb in debs:
        (into / deb.name).symlink_to(deb)
        control = subprocess.run(
            ["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True
        ).stdout.rstrip("\n")
        data = deb.read_bytes()
        stanzas.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = "\n".join(stanzas).encode()
    (into / "Packages").write_bytes(packages)
    digest = hashlib.sha256(packages).hexdigest()
    date = email.utils.formatdate(usegmt=True)
    (into / "Release").write_text(
        f"Origin: aenv-tests\nLabel: aenv-tests\nDate: {date}\n"
        f"SHA256:\n {digest} {len(packages)} Packages\n"
    )


def wheel_directory(wheels: Iterable[Path], into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        (into / wheel.name).symlink_to(wheel)


def _wait_for_port(netns: str, address: str) -> None:
    deadline = time.monotonic() + 10
    probe = ["ip", "netns", "exec", netns, sys.executable, "-c"]
    probe.append(f"import socket; socket.create_connection(({address!r}, {PORT}), 1).close()")
    while subprocess.run(probe, capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the mirror did not listen on {address}:{PORT}")
        time.sleep(0.1)


@contextmanager
def package_mirror(cfg: Config, root: Path) -> Iterator[Mirror]:
    """The kit's packages under `root`, served from a namespace host until the block ends."""
    debs, wheels = kit_packages(cfg)
    if not debs or not wheels:
        raise RuntimeError("the kit build's package caches are empty: run `aenv kit build`")
    flat_repository(debs, root / "debian")
    wheel_directory(wheels, root / "wheels")
    with peer(random_slash30("203.0.113.0/24")) as host:
        command = ["ip", "netns", "exec", host.netns, sys.executable, "-m", "http.server"]
        command += ["--bind", host.ip, "--directory", str(root), str(PORT)]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_port(host.netns, host.ip)
            yield Mirror(f"http://{host.ip}:{PORT}")
        finally:
            server.kill()
            server.wait()
