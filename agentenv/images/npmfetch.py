"""Single packages from the npm registry, checked against the registry's integrity hash.

Used for binaries published there (deno's per-platform packages), since only Debian,
PyPI and npm are reachable from where templates are built.
"""

from __future__ import annotations

import base64
import hashlib
import json
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

from agentenv.guest.buildutil import KitBuildError, locked

NPM_REGISTRY = "https://registry.npmjs.org"


def tarball_name(package: str, version: str) -> str:
    """The cache file name of `package@version` (a scope's slash made safe)."""
    return f"{package.replace('/', '+')}-{version}.tgz"


def fetch_package(
    package: str, version: str, cache: Path, registry: str = NPM_REGISTRY, timeout: float = 300
) -> Path:
    """The tarball of `package@version` in `cache`, downloaded once and verified."""
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / tarball_name(package, version)
    with locked(cache / ".lock"):
        if dest.is_file():
            return dest
        meta_url = f"{registry}/{urllib.parse.quote(package, safe='@')}/{version}"
        try:
            with urllib.request.urlopen(meta_url, timeout=timeout) as resp:
                dist = json.load(resp)["dist"]
            tmp = dest.with_suffix(".part")
            with urllib.request.urlopen(dist["tarball"], timeout=timeout) as resp:
                tmp.write_bytes(resp.read())
        except (OSError, KeyError, ValueError) as exc:
            raise KitBuildError(f"npm: cannot fetch {package}@{version}: {exc}") from exc
        check_integrity(tmp, dist.get("integrity", ""), f"{package}@{version}")
        tmp.replace(dest)
        return dest


def check_integrity(path: Path, integrity: str, what: str) -> None:
    """Raise unless `path` matches the registry's `sha512-<base64>` integrity string."""
    algo, _, want = integrity.partition("-")
    if algo != "sha512" or not want:
        raise KitBuildError(f"npm: {what} has no sha512 integrity ({integrity!r})")
    got = base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()
    if got != want:
        path.unlink(missing_ok=True)
        raise KitBuildError(f"npm: {what} does not match its integrity hash")


def extract_member(tarball: Path, member: str, dest: Path, mode: int = 0o755) -> None:
    """Write one file of an npm tarball (`package/<member>`) to `dest`."""
    with tarfile.open(tarball) as tar:
        try:
            src = tar.extractfile(f"package/{member}")
        except KeyError:
            src = None
        if src is None:
            raise KitBuildError(f"npm: {tarball.name} has no file {member}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    dest.chmod(mode)
