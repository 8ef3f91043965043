"""`base` on a cluster's nodes: published once as block layers in the shared object
store, and what every node then starts sandboxes from, whatever its own build."""

from __future__ import annotations

import json
from pathlib import Path

from agentenv.config import Config
from agentenv.images.base import base_version
from agentenv.images.catalog import BASE, TemplateCatalog
from agentenv.images.templates import TemplateRegistry
from agentenv.storage.filelayer import load_chain, materialize
from agentenv.storage.posix import PosixObjectStore


def _node(tmp_path: Path, name: str, content: bytes) -> tuple[Config, TemplateCatalog]:
    """A node sharing `tmp_path/objects`, with its own build of `base`."""
    cfg = Config()
    cfg.paths.home = str(tmp_path / name)
    cfg.server.role = "node"
    base = cfg.images_dir / "base"
    base.mkdir(parents=True)
    (base / "rootfs.ext4").write_bytes(content)
    (base / "manifest.json").write_text(json.dumps({"version": base_version(cfg)}))
    store = PosixObjectStore(tmp_path / "objects")
    return cfg, TemplateCatalog(cfg, TemplateRegistry(store), blockd=None)  # type: ignore[arg-type]


def test_the_first_node_publishes_base_and_every_node_uses_that(tmp_path: Path) -> None:
    first_build = b"first node's base".ljust(3 * 65536, b"\1")
    _, first = _node(tmp_path, "node-1", first_build)
    _, second = _node(tmp_path, "node-2", b"second node's own build".ljust(65536, b"\2"))
    published = first.shared_base()
    assert (published.template_id, published.digest) == (BASE, f"base:{base_version(Config())}")
    # The second node's own build is not published again: it takes the first's.
    assert second.shared_base() == published
    # The layers hold the first node's image, block for block.
    store = first.templates.store
    out = tmp_path / "read-back"
    materialize(load_chain(store, published.layers[-1]), store, out)
    assert out.read_bytes() == first_build
    # Listed once (the built-in entry), while the collector sees its layers as a root.
    assert [r.template_id for r in first.templates.list()] == [BASE]


def test_a_new_version_of_base_is_published_over_the_old(tmp_path: Path) -> None:
    cfg, catalog = _node(tmp_path, "node-1", b"old".ljust(65536, b"\0"))
    old = catalog.shared_base()
    cfg.kit.suite = "trixie"  # another version of base's inputs
    base = cfg.images_dir / "base"
    (base / "rootfs.ext4").write_bytes(b"new".ljust(65536, b"\3"))
    (base / "manifest.json").write_text(json.dumps({"version": base_version(cfg)}))
    new = catalog.shared_base()
    assert new.digest != old.digest and new.layers != old.layers
