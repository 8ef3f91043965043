"""Templates a sandbox can start from, resolved to a disk the VMM can open."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config import Config
from ..errors import NotFound, Unavailable
from ..storage.blockd import BlockdClient, BlockdError
from ..storage.filelayer import store_file
from ..storage.gc import write_lease
from .base import base_version, load_base_template
from .snapshots import DEFAULT_TAG
from .templates import TemplateRecord, TemplateRegistry, tag_not_found, template_not_found

BASE = "base"
BASE_SOURCE = "debian:bookworm (built in)"
_BUILD_BASE = "run `aenv kit build` (or `make run`) on a node"
# E2B's base image, as the SDKs' `from_base_image()` and Dockerfiles name it: `base` here.
E2B_BASE_IMAGES = frozenset(
    {"e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base", "docker.io/e2bdev/base:latest"}
)


# Seconds a published `base` is taken as found before the object store is asked again.
BASE_RECHECK = 5.0


def base_in_store(cfg: Config) -> bool:
    """Whether `base` is served from the object store: when that store outlives this
    machine or is shared with other nodes, so a sandbox stored there finds the very disk
    it was made on. A single server on a local store keeps its own file (a copy of it in
    the store would gain nothing)."""
    return cfg.server.role == "node" or cfg.storage.backend == "s3"


@dataclass(frozen=True)
class Template:
    """A resolved template: its read-only disk and the image config the sandbox honours."""

    template_id: str
    alias: str | None
    rootfs: Path
    rootfs_format: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""
    # The image's Entrypoint + Cmd, started in the background when a sandbox starts.
    command: list[str] = field(default_factory=list)
    # The template's own sandbox size; None: the server's default.
    vcpus: int | None = None
    memory_mb: int | None = None


class TemplateCatalog:
    """The built-in `base` (a local ext4 file, or block layers on a cluster's nodes) and
    pulled templates (block layer stacks).

    A pulled template's disk is the block daemon's file for its layer stack, named by the
    top layer, so every sandbox of one image shares one file and one page cache.
    """

    def __init__(self, cfg: Config, templates: TemplateRegistry, blockd: BlockdClient) -> None:
        self._cfg = cfg
        self.templates = templates
        self._blockd = blockd
        self._publishing = threading.Lock()
        # `base` as last found published in this version, and when: creates come often.
        self._published_base: tuple[float, TemplateRecord] | None = None

    def named(self, ref: str) -> str:
        """Blocking: the template a create's `ref` names, `name` or `name:default` (its one
        build); NotFound in E2B's words for any other name, an image reference included."""
        name, sep, tag = ref.partition(":")
        if name != BASE and self.templates.find(name) is None:
            raise template_not_found(ref)
        if sep and tag.lower() != DEFAULT_TAG:
            raise tag_not_found(name, tag)
        return name

    def resolve(self, name: str) -> Template:
        """Blocking (it may mount a stack); raises NotFound for unknown templates."""
        if name == BASE:
            if base_in_store(self._cfg):
                return self.open(self.shared_base())
            base = load_base_template(self._cfg)
            if base is None:
                raise NotFound(f"template 'base' is not built yet: {_BUILD_BASE}")
            return Template(BASE, BASE, base.rootfs, "raw")
        return self.open(self.templates.get(name))

    def shared_base(self) -> TemplateRecord:
        """Blocking: `base` as block layers in the object store, which a cluster's nodes
        share, so a sandbox paused on one node resumes on another over the same disk. The
        first node with this version of `base` built publishes it (once: a layer of the
        same content is not written again)."""
        version = base_version(self._cfg)
        known = self._published_base
        if known is not None and time.monotonic() - known[0] < BASE_RECHECK:
            return known[1]
        published = self.templates.find(BASE)
        if published is not None and published.digest == f"base:{version}":
            self._published_base = (time.monotonic(), published)
            return published
        with self._publishing, write_lease(self.templates.store):
            published = self.templates.find(BASE)
            if published is not None and published.digest == f"base:{version}":
                return published
            local = load_base_template(self._cfg)
            if local is None:
                raise NotFound(f"template 'base' {version} is not published yet: {_BUILD_BASE}")
            layer_id, _ = store_file(self.templates.store, local.rootfs, None)
            record = TemplateRecord(
                template_id=BASE,
                source=BASE_SOURCE,
                digest=f"base:{version}",
                layers=[layer_id],
                size=local.rootfs.stat().st_size,
            )
            self.templates.save(record)
            return record

    def open(self, record: TemplateRecord) -> Template:
        name = record.layers[-1]
        try:
            path, _ = self._blockd.mount(name, record.layers)
            # What boot does not read comes in the background, at low priority.
            self._blockd.prefetch(name)
        except BlockdError as exc:
            raise Unavailable(f"template '{record.template_id}': disk unavailable: {exc}") from exc
        return Template(
            record.template_id,
            record.template_id,
            path,
            "raw",
            env=record.env,
            workdir=record.workdir,
            user=record.user.split(":", 1)[0],
            command=[*(record.entrypoint or []), *(record.cmd or [])],
            vcpus=record.vcpus,
            memory_mb=record.memory_mb,
        )
