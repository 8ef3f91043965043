"""OCI and Docker v2 manifests, indexes and image configs, parsed into small dataclasses."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import InvalidInput
from .registry_errors import NoMatchingPlatform

__all__ = [
    "DOCKER_MANIFEST",
    "DOCKER_MANIFEST_LIST",
    "INDEX_TYPES",
    "MANIFEST_ACCEPT",
    "MANIFEST_TYPES",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "Descriptor",
    "ImageConfig",
    "Manifest",
    "layer_compression",
    "parse_config",
    "parse_manifest",
    "select_platform",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
MANIFEST_ACCEPT = ", ".join((OCI_INDEX, DOCKER_MANIFEST_LIST, OCI_MANIFEST, DOCKER_MANIFEST))

# Layer media type -> compression ("none", "gzip", "zstd"); foreign and non-distributable
# layers are still ordinary tarballs once fetched.
_LAYER_COMPRESSION = {
    "application/vnd.oci.image.layer.v1.tar": "none",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "none",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar": "none",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd": "zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}
_DIGEST = re.compile(r"(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})")


def layer_compression(media_type: str) -> str:
    """ "none", "gzip" or "zstd" for a layer media type; InvalidInput for anything else."""
    try:
        return _LAYER_COMPRESSION[media_type]
    except KeyError:
        raise InvalidInput(f"unsupported layer media type {media_type!r}") from None


@dataclass(frozen=True)
class Descriptor:
    """A content-addressed pointer: what it is, its digest, and its exact size."""

    media_type: str
    digest: str
    size: int
    platform: str | None = None
    urls: tuple[str, ...] = ()

    @property
    def compression(self) -> str:
        return layer_compression(self.media_type)


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest (config + layers) or index (`manifests`), with its media type."""

    media_type: str
    config: Descriptor | None = None
    layers: tuple[Descriptor, ...] = ()
    manifests: tuple[Descriptor, ...] = ()

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES


@dataclass(frozen=True)
class ImageConfig:
    """The runtime settings of an image config that a sandbox honours."""

    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    os: str = ""
    architecture: str = ""
    diff_ids: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def env_dict(self) -> dict[str, str]:
        """`Env` as a mapping; later duplicates win, as in Docker."""
        return dict(item.partition("=")[::2] for item in self.env)


def parse_manifest(body: bytes, content_type: str | None) -> Manifest:
    """Parse a manifest or index body; the Content-Type wins over the body's `mediaType`."""
    doc = _json_object(body, "manifest")
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type not in INDEX_TYPES | MANIFEST_TYPES:
        media_type = str(doc.get("mediaType") or "")
    if media_type not in INDEX_TYPES | MANIFEST_TYPES:
        if doc.get("schemaVersion") == 1:
            raise InvalidInput("unsupported manifest: Docker schema 1 (push it again with v2)")
        # Some registries omit both; the shape tells us which kind it is.
        media_type = OCI_INDEX if "manifests" in doc else OCI_MANIFEST
    if doc.get("schemaVersion") != 2:
        raise InvalidInput(f"unsupported manifest schemaVersion {doc.get('schemaVersion')!r}")
    if media_type in INDEX_TYPES:
        entries = _list(doc, "manifests")
        return Manifest(media_type, manifests=tuple(_descriptor(e) for e in entries))
    config = _descriptor(doc.get("config"))
    layers = tuple(_descriptor(e) for e in _list(doc, "layers"))
    for layer in layers:
        layer_compression(layer.media_type)
    return Manifest(media_type, config=config, layers=layers)


def select_platform(index: Manifest, wanted: str, ref: str) -> Descriptor:
    """The index entry for `wanted` ("os/arch[/variant]"); NoMatchingPlatform lists the rest."""
    os_name, _, rest = wanted.partition("/")
    arch, _, variant = rest.partition("/")
    available: list[str] = []
    for entry in index.manifests:
        if entry.platform is None or entry.platform.startswith("unknown/"):
            continue  # attestations and other non-image entries
        e_os, _, e_rest = entry.platform.partition("/")
        e_arch, _, e_variant = e_rest.partition("/")
        if e_os == os_name and e_arch == arch and (not variant or variant == e_variant):
            return entry
        available.append(entry.platform)
    raise NoMatchingPlatform(ref, wanted, available)


def parse_config(body: bytes) -> ImageConfig:
    """Parse an image config blob: runtime settings from `config`, layers from `rootfs`."""
    doc = _json_object(body, "image config")
    cfg = doc.get("config") or {}
    if not isinstance(cfg, dict):
        raise InvalidInput("invalid image config: `config` is not an object")
    rootfs = doc.get("rootfs") or {}
    diff_ids = tuple(str(d) for d in (rootfs.get("diff_ids") or []))
    for d in diff_ids:
        if not _DIGEST.fullmatch(d):
            raise InvalidInput(f"invalid image config: bad diff_id {d!r}")
    return ImageConfig(
        env=_strings(cfg.get("Env")) or (),
        working_dir=str(cfg.get("WorkingDir") or ""),
        user=str(cfg.get("User") or ""),
        entrypoint=_strings(cfg.get("Entrypoint")),
        cmd=_strings(cfg.get("Cmd")),
        os=str(doc.get("os") or ""),
        architecture=str(doc.get("architecture") or ""),
        diff_ids=diff_ids,
        labels={str(k): str(v) for k, v in (cfg.get("Labels") or {}).items()},
    )


def _json_object(body: bytes, what: str) -> dict:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise InvalidInput(f"invalid {what}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"invalid {what}: not a JSON object")
    return doc


def _list(doc: dict, key: str) -> list:
    value = doc.get(key)
    if not isinstance(value, list):
        raise InvalidInput(f"invalid manifest: `{key}` is not a list")
    return value


def _strings(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)  # Docker accepts a bare string for Cmd/Entrypoint
    if not isinstance(value, list):
        raise InvalidInput(f"invalid image config: expected a list of strings, got {value!r}")
    return tuple(str(v) for v in value)


def _descriptor(entry: object) -> Descriptor:
    if not isinstance(entry, dict):
        raise InvalidInput("invalid manifest: descriptor is not an object")
    digest, size = entry.get("digest"), entry.get("size")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidInput(f"invalid manifest: bad digest {digest!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"invalid manifest: bad size {size!r} for {digest}")
    plat = entry.get("platform")
    platform = None
    if isinstance(plat, dict):
        platform = f"{plat.get('os', '')}/{plat.get('architecture', '')}"
        if plat.get("variant"):
            platform += f"/{plat['variant']}"
    urls = tuple(str(u) for u in entry.get("urls") or ())
    return Descriptor(str(entry.get("mediaType") or ""), digest, size, platform, urls)
