"""Build OCI images without Docker and push them over the distribution API, for tests.

`LayerBuilder` describes a layer entry by entry (or from a directory tree) and can express what
real images contain: whiteouts, opaque directories, hardlinks, symlinks, device nodes, xattrs
and non-root owners. `build_layer` compresses it, `build_image` adds config and manifest,
`build_index` groups platforms, and `push_image` / `push_index` upload them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = [
    "OCI_INDEX",
    "OCI_MANIFEST",
    "BuiltImage",
    "BuiltIndex",
    "Layer",
    "LayerBuilder",
    "build_image",
    "build_index",
    "build_layer",
    "digest_of",
    "push_blob",
    "push_image",
    "push_index",
    "push_manifest",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER_TYPES = {
    ("oci", "gzip"): "application/vnd.oci.image.layer.v1.tar+gzip",
    ("oci", "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
    ("oci", "none"): "application/vnd.oci.image.layer.v1.tar",
    ("docker", "gzip"): "application/vnd.docker.image.rootfs.diff.tar.gzip",
    ("docker", "none"): "application/vnd.docker.image.rootfs.diff.tar",
}
# Fixed timestamps keep layers (and so digests) identical from run to run.
EPOCH = 1_700_000_000


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class LayerBuilder:
    """An ordered list of tar entries; paths are relative to the root (`etc/passwd`)."""

    entries: list[tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=list)

    def _add(self, info: tarfile.TarInfo, data: bytes | None = None) -> LayerBuilder:
        info.name = info.name.strip("/")
        info.mtime = info.mtime or EPOCH
        if info.uname == "" and info.uid == 0:
            info.uname = info.gname = "root"
        self.entries.append((info, data))
        return self

    @staticmethod
    def _info(path: str, kind: bytes, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.uid, info.gid = kind, mode, uid, gid
        return info

    def dir(self, path: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> LayerBuilder:
        return self._add(self._info(path, tarfile.DIRTYPE, mode, uid, gid))

    def file(
        self,
        path: str,
        data: bytes = b"",
        mode: int = 0o644,
        uid: int = 0,
        gid: int = 0,
        xattrs: Mapping[str, str] | None = None,
    ) -> LayerBuilder:
        info = self._info(path, tarfile.REGTYPE, mode, uid, gid)
        info.size = len(data)
        # PAX carries xattrs under SCHILY.xattr.<name>, as Docker and containerd write them.
        info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in (xattrs or {}).items()}
        return self._add(info, data)

    def symlink(self, path: str, target: str, uid: int = 0, gid: int = 0) -> LayerBuilder:
        info = self._info(path, tarfile.SYMTYPE, 0o777, uid, gid)
        info.linkname = target
        return self._add(info)

    def hardlink(self, path: str, target: str) -> LayerBuilder:
        """`path` becomes another name for the earlier entry `target` (root-relative)."""
        info = self._info(path, tarfile.LNKTYPE, 0o644, 0, 0)
        info.linkname = target.strip("/")
        return self._add(info)

    def device(
        self, path: str, major: int, minor: int, kind: str = "c", mode: int = 0o666
    ) -> LayerBuilder:
        info = self._info(path, tarfile.CHRTYPE if kind == "c" else tarfile.BLKTYPE, mode, 0, 0)
        info.devmajor, info.devminor = major, minor
        return self._add(info)

    def fifo(self, path: str, mode: int = 0o644) -> LayerBuilder:
        return self._add(self._info(path, tarfile.FIFOTYPE, mode, 0, 0))

    def whiteout(self, path: str) -> LayerBuilder:
        """Delete `path` from lower layers: an empty `.wh.<name>` next to it."""
        parent, _, name = path.strip("/").rpartition("/")
        return self.file(f"{parent}/.wh.{name}" if parent else f".wh.{name}")

    def opaque(self, directory: str) -> LayerBuilder:
        """Hide everything lower layers put in `directory` (the opaque marker)."""
        return self.file(f"{directory.strip('/')}/.wh..wh..opq")

    @classmethod
    def from_dir(cls, root: Path, owner: tuple[int, int] | None = (0, 0)) -> LayerBuilder:
        """Entries for a directory tree, sorted; `owner=None` keeps the files' real owners.

        Files named `.wh.*` are copied as they are, so a tree can carry its own whiteouts.
        """
        builder = cls()
        seen: dict[tuple[int, int], str] = {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = Path(dirpath, name)
                rel = full.relative_to(root).as_posix()
                st = full.lstat()
                uid, gid = owner if owner is not None else (st.st_uid, st.st_gid)
                mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISDIR(st.st_mode):
                    builder.dir(rel, mode, uid, gid)
                elif stat.S_ISLNK(st.st_mode):
                    builder.symlink(rel, os.readlink(full), uid, gid)
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if st.st_nlink > 1 and key in seen:
                        builder.hardlink(rel, seen[key])
                        continue
                    seen[key] = rel
                    builder.file(rel, full.read_bytes(), mode, uid, gid)
                elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                    kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
                    builder.device(rel, os.major(st.st_rdev), os.minor(st.st_rdev), kind, mode)
                elif stat.S_ISFIFO(st.st_mode):
                    builder.fifo(rel, mode)
        return builder

    def tar_bytes(self) -> bytes:
        """The uncompressed PAX tar, in insertion order."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in self.entries:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


@dataclass(frozen=True)
class Layer:
    """A built layer: the tar, its compressed blob, and the descriptor fields."""

    tar: bytes
    blob: bytes
    media_type: str
    compression: str

    @property
    def digest(self) -> str:
        return digest_of(self.blob)

    @property
    def diff_id(self) -> str:
        return digest_of(self.tar)

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.blob)}


def build_layer(
    builder: LayerBuilder | bytes, compression: str = "gzip", flavour: str = "oci"
) -> Layer:
    """Compress a layer ("gzip", "zstd" or "none"); `flavour="docker"` uses Docker types."""
    tar = builder if isinstance(builder, bytes) else builder.tar_bytes()
    if compression == "gzip":
        blob = gzip.compress(tar, mtime=0)
    elif compression == "zstd":
        import zstandard

        blob = zstandard.ZstdCompressor(level=3).compress(tar)
    elif compression == "none":
        blob = tar
    else:
        raise ValueError(f"unknown compression {compression!r}")
    return Layer(tar, blob, LAYER_TYPES[(flavour, compression)], compression)


BUSYBOX_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
BUSYBOX_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


def busybox_layer(applets: bool = True, extra: Mapping[str, bytes] | None = None) -> Layer:
    """A root filesystem of the host's static busybox (and its applets as symlinks)."""
    binary = shutil.which("busybox")
    assert binary is not None, "busybox-static is in the Makefile's packages"
    layer = (
        LayerBuilder()
        .file("bin/busybox", Path(binary).read_bytes(), mode=0o755)
        .dir("tmp", mode=0o1777)
        .dir("root", mode=0o700)
        .dir("home")
        .file("etc/passwd", BUSYBOX_PASSWD)
        .file("etc/group", BUSYBOX_GROUP)
    )
    if applets:
        names = subprocess.run([binary, "--list"], capture_output=True, text=True).stdout
        for name in names.split():
            if name != "busybox":
                layer = layer.symlink(f"bin/{name}", "busybox")
    for path, content in (extra or {}).items():
        layer = layer.file(path, content)
    return build_layer(layer, "gzip")


@dataclass(frozen=True)
class BuiltImage:
    """Config and manifest bytes of one single-platform image, plus its layers."""

    layers: tuple[Layer, ...]
    config: bytes
    manifest: bytes
    media_type: str
    architecture: str
    os: str = "linux"

    @property
    def digest(self) -> str:
        return digest_of(self.manifest)

    @property
    def config_digest(self) -> str:
        return digest_of(self.config)


@dataclass(frozen=True)
class BuiltIndex:
    images: tuple[BuiltImage, ...]
    manifest: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return digest_of(self.manifest)


def build_image(
    layers: Sequence[Layer],
    *,
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
    working_dir: str = "",
    user: str = "",
    cmd: Sequence[str] | None = ("/bin/sh",),
    entrypoint: Sequence[str] | None = None,
    architecture: str = "amd64",
    os_name: str = "linux",
    flavour: str = "oci",
) -> BuiltImage:
    """Config JSON (runtime settings + diff_ids) and a manifest pointing at it and the layers."""
    runtime: dict[str, object] = {"Env": list(env)}
    if working_dir:
        runtime["WorkingDir"] = working_dir
    if user:
        runtime["User"] = user
    if cmd is not None:
        runtime["Cmd"] = list(cmd)
    if entrypoint is not None:
        runtime["Entrypoint"] = list(entrypoint)
    config = _json(
        {
            "architecture": architecture,
            "os": os_name,
            "created": "2024-01-01T00:00:00Z",
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
            "history": [{"created_by": "oci_build"} for _ in layers],
        }
    )
    manifest_type = OCI_MANIFEST if flavour == "oci" else DOCKER_MANIFEST
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": manifest_type,
            "config": {
                "mediaType": OCI_CONFIG if flavour == "oci" else DOCKER_CONFIG,
                "digest": digest_of(config),
                "size": len(config),
            },
            "layers": [layer.descriptor() for layer in layers],
        }
    )
    return BuiltImage(tuple(layers), config, manifest, manifest_type, architecture, os_name)


def build_index(images: Sequence[BuiltImage], flavour: str = "oci") -> BuiltIndex:
    """An index (or Docker manifest list) over single-platform images."""
    media_type = OCI_INDEX if flavour == "oci" else DOCKER_LIST
    entries = [
        {
            "mediaType": image.media_type,
            "digest": image.digest,
            "size": len(image.manifest),
            "platform": {"architecture": image.architecture, "os": image.os},
        }
        for image in images
    ]
    body = _json({"schemaVersion": 2, "mediaType": media_type, "manifests": entries})
    return BuiltIndex(tuple(images), body, media_type)


def push_blob(
    client: httpx.Client, base: str, repository: str, data: bytes, digest: str | None = None
) -> str:
    """Monolithic upload: POST for an upload URL, then PUT the bytes with `?digest=`."""
    digest = digest or digest_of(data)
    if client.head(f"{base}/v2/{repository}/blobs/{digest}").status_code == 200:
        return digest
    started = client.post(f"{base}/v2/{repository}/blobs/uploads/")
    _check(started, 202)
    location = httpx.URL(base).join(started.headers["Location"])
    done = client.put(
        location.copy_merge_params({"digest": digest}),
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    _check(done, 201)
    return digest


def push_manifest(
    client: httpx.Client, base: str, repository: str, reference: str, body: bytes, media_type: str
) -> None:
    response = client.put(
        f"{base}/v2/{repository}/manifests/{reference}",
        content=body,
        headers={"Content-Type": media_type},
    )
    _check(response, 201)


def push_image(
    base: str,
    repository: str,
    tag: str | None,
    image: BuiltImage,
    auth: tuple[str, str] | None = None,
) -> str:
    """Push layers, config and manifest (tagged `tag`, or by digest only); returns the digest."""
    with httpx.Client(auth=auth, timeout=30.0) as client:
        _push_image(client, base, repository, tag, image)
    return image.digest


def push_index(
    base: str, repository: str, tag: str, index: BuiltIndex, auth: tuple[str, str] | None = None
) -> str:
    """Push every platform image by digest, then the index under `tag`; returns its digest."""
    with httpx.Client(auth=auth, timeout=30.0) as client:
        for image in index.images:
            _push_image(client, base, repository, None, image)
        push_manifest(client, base, repository, tag, index.manifest, index.media_type)
    return index.digest


def _push_image(
    client: httpx.Client, base: str, repository: str, tag: str | None, image: BuiltImage
) -> None:
    for layer in image.layers:
        push_blob(client, base, repository, layer.blob)
    push_blob(client, base, repository, image.config)
    push_manifest(client, base, repository, tag or image.digest, image.manifest, image.media_type)


def _check(response: httpx.Response, status: int) -> None:
    if response.status_code != status:
        raise RuntimeError(
            f"{response.request.method} {response.request.url}: {response.status_code} "
            f"{response.text[:500]}"
        )


def _json(doc: object) -> bytes:
    return json.dumps(doc, indent=2, sort_keys=True).encode()
