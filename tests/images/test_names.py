"""Names a create takes mean one thing: a snapshot, a template or its tag; never an image
pulled behind the caller's back (`TemplateCatalog.named`, `full_reference`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentenv.config import Config
from agentenv.errors import NotFound
from agentenv.images.catalog import TemplateCatalog
from agentenv.images.reference import full_reference
from agentenv.images.snapshots import SnapshotRecord, SnapshotRegistry
from agentenv.images.templates import TemplateRecord, TemplateRegistry
from agentenv.storage.posix import PosixObjectStore


@pytest.fixture
def store(tmp_path: Path) -> PosixObjectStore:
    return PosixObjectStore(tmp_path / "objects")


def _catalog(store: PosixObjectStore) -> TemplateCatalog:
    templates = TemplateRegistry(store)
    templates.save(TemplateRecord("app", "localhost:5000/team/app:v1", "sha256:1", ["l1"], 1))
    blockd: Any = None  # naming a template opens no disk
    return TemplateCatalog(Config(), templates, blockd)


def _missing(catalog: TemplateCatalog, ref: str) -> str:
    with pytest.raises(NotFound) as caught:
        catalog.named(ref)
    return caught.value.message


def test_a_template_is_its_name_or_its_default_tag(store: PosixObjectStore) -> None:
    catalog = _catalog(store)
    for ref, template in (("app", "app"), ("app:default", "app"), ("base", "base")):
        assert catalog.named(ref) == template
    assert _missing(catalog, "app:v2") == "tag 'v2' does not exist for template 'app'"
    assert _missing(catalog, "base:v2") == "tag 'v2' does not exist for template 'base'"


def test_anything_else_is_e2bs_404(store: PosixObjectStore) -> None:
    catalog = _catalog(store)
    assert _missing(catalog, "gone") == "template 'gone' not found"
    assert _missing(catalog, "gone:v1") == "template 'gone' not found"
    # Short Docker Hub names are `name:tag` here, as in E2B.
    assert _missing(catalog, "ubuntu:22.04") == "template 'ubuntu' not found"
    for image in ("localhost:5000/team/app:v1", "ghcr.io/o/r@sha256:" + "a" * 64):
        assert _missing(catalog, image).startswith(f"template '{image}' not found (an image")
    assert _missing(catalog, "Odd Name") == "template 'Odd Name' not found"


def test_a_deleted_snapshot_is_a_404_not_an_image(store: PosixObjectStore) -> None:
    snapshots = SnapshotRegistry(store)
    build = SnapshotRecord("ubuntu", "b1", "i1", "base", True, 1, 256, "k1")
    snapshots.save(build)
    with pytest.raises(NotFound, match=r"^tag 'v9' does not exist for template 'ubuntu'$"):
        snapshots.lookup("ubuntu:v9")
    snapshots.delete("ubuntu")
    # Its name no longer names a snapshot, and never Docker Hub's `ubuntu`.
    assert snapshots.lookup("ubuntu:b1") is None
    assert _missing(_catalog(store), "ubuntu:b1") == "template 'ubuntu' not found"


def test_a_full_reference_names_its_registry() -> None:
    full = {
        "localhost:5000/img:tag": "localhost:5000/img:tag",
        "localhost/img": "localhost/img:latest",
        "ghcr.io/o/r:1": "ghcr.io/o/r:1",
        "docker.io/library/ubuntu:22.04": "docker.io/library/ubuntu:22.04",
        "[::1]:5000/img@sha256:" + "b" * 64: "[::1]:5000/img@sha256:" + "b" * 64,
    }
    for text, canonical in full.items():
        assert str(full_reference(text)) == canonical
    for short in ("ubuntu", "ubuntu:22.04", "library/ubuntu", "team/app:v1", "a:b/c", "x.io/"):
        assert full_reference(short) is None
