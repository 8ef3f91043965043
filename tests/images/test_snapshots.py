"""The snapshot registry: names, builds, the default tag, lookups and deletes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentenv.errors import NotFound
from agentenv.images.snapshots import (
    SnapshotRecord,
    SnapshotRegistry,
    new_name,
    new_tag,
    newest_tags,
    snapshot_names,
)
from agentenv.storage.posix import PosixObjectStore


def _build(name: str, created_at: str, source: str = "i1") -> SnapshotRecord:
    return SnapshotRecord(
        name=name,
        tag=new_tag(),
        source_sandbox=source,
        template_id="base",
        memory=True,
        vcpus=1,
        memory_mb=256,
        kit="k1",
        created_at=created_at,
    )


@pytest.fixture
def registry(tmp_path: Path) -> SnapshotRegistry:
    return SnapshotRegistry(PosixObjectStore(tmp_path / "objects"))


def test_a_name_means_its_newest_build(registry: SnapshotRegistry) -> None:
    old = _build("web", "2026-01-01T00:00:00+00:00")
    new = _build("web", "2026-01-02T00:00:00+00:00")
    registry.save(new)
    registry.save(old)
    assert [b.tag for b in registry.builds("web")] == [old.tag, new.tag]
    assert registry.get("web").tag == new.tag
    assert registry.get("web:default").tag == new.tag
    assert registry.get(old.snapshot_id).tag == old.tag
    newest = newest_tags(registry.list())
    registry.save(_build("webby", "2026-01-03T00:00:00+00:00"))
    assert [r.name for r in registry.list("webb")] == ["webby"]
    assert snapshot_names(new, newest["web"] == new.tag) == [new.snapshot_id, "web:default"]
    assert snapshot_names(old, newest["web"] == old.tag) == [old.snapshot_id]


def test_lookup_tells_images_from_missing_builds(registry: SnapshotRegistry) -> None:
    only = _build("web", "2026-01-01T00:00:00+00:00")
    registry.save(only)
    for ref in ("web", "web:default", only.snapshot_id):
        found = registry.lookup(ref)
        assert found is not None and found.tag == only.tag
    # Not a snapshot's name: maybe an image reference, for the caller to decide.
    assert registry.lookup("ubuntu:22.04") is None
    assert registry.lookup("docker.io/library/ubuntu:22.04") is None
    # A snapshot's name with a build it does not have is a 404, never a pull.
    with pytest.raises(NotFound):
        registry.lookup("web:b0000000000")
    for odd in ("", ":", "WEB", "web:../x", "a/../../b:c"):
        assert registry.find(odd) is None


def test_delete_one_build_or_every_build(registry: SnapshotRegistry) -> None:
    first = _build("web", "2026-01-01T00:00:00+00:00")
    second = _build("web", "2026-01-02T00:00:00+00:00")
    other = _build(new_name(), "2026-01-03T00:00:00+00:00", source="i2")
    for record in (first, second, other):
        registry.save(record)
    assert [r.tag for r in registry.delete(second.snapshot_id)] == [second.tag]
    assert registry.get("web").tag == first.tag  # the default moved back
    assert [r.tag for r in registry.delete("web")] == [first.tag]
    with pytest.raises(NotFound):
        registry.delete("web")
    assert [r.snapshot_id for r in registry.list()] == [other.snapshot_id]


def test_tags_name_builds_and_a_default_tag_outranks_the_newest(
    registry: SnapshotRegistry,
) -> None:
    v1 = _build("app", "2026-01-01T00:00:00+00:00")
    v2 = _build("app", "2026-01-02T00:00:00+00:00")
    registry.save(v1)
    registry.save(v2)
    registry.tag(v1, ["v1", "default"])
    registry.tag(v2, ["v2"])
    assert registry.get("app:v1").tag == v1.tag and registry.lookup("app:v2").tag == v2.tag
    # A given `default` tag wins over "the newest build".
    assert registry.get("app").tag == v1.tag
    with pytest.raises(NotFound):
        registry.lookup("app:v3")
    # A tag moves when given again; tags of a deleted build go with it.
    registry.tag(v2, ["v1"])
    assert registry.get("app:v1").tag == v2.tag
    assert [(t, b.tag) for t, b, _ in registry.tags("app")] == [
        ("default", v1.tag),
        ("v2", v2.tag),
        ("v1", v2.tag),
    ]
    registry.delete(v2.snapshot_id)
    assert [t for t, _, _ in registry.tags("app")] == ["default"]
    registry.untag("app", ["default"])
    assert registry.tags("app") == [] and registry.get("app").tag == v1.tag


def test_a_tag_keeps_the_builds_it_named(registry: SnapshotRegistry) -> None:
    v1 = _build("app", "2026-01-01T00:00:00+00:00")
    v2 = _build("app", "2026-01-02T00:00:00+00:00")
    registry.save(v1)
    registry.save(v2)
    # A tag saved before histories were kept has the one build it names.
    registry._store.put(
        "snapshot-tags/app/live.json",
        json.dumps({"build": v1.tag, "createdAt": "2026-01-03T00:00:00+00:00"}).encode(),
    )
    assert [b.tag for b, _ in registry.assignments("app")["live"]] == [v1.tag]
    registry.tag(v2, ["live"])
    assert [b.tag for b, _ in registry.assignments("app")["live"]] == [v2.tag, v1.tag]
    registry.delete(v1.snapshot_id)  # a deleted build leaves the history
    assert [b.tag for b, _ in registry.assignments("app")["live"]] == [v2.tag]
    assert registry.assignments("nothing") == {}
