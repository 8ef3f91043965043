"""Snapshots are templates, as in E2B: a name with one build per snapshot taken under it.

A snapshot's id is `name:tag`; `name` and `name:default` mean the name's newest build.
Records live in the object store next to template records, so every node sees them.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errors import NotFound
from ..storage.objectstore import ObjectNotFound, ObjectStore
from .templates import valid_name

DEFAULT_TAG = "default"
_ALPHABET = string.ascii_lowercase + string.digits


@dataclass
class SnapshotRecord:
    """One build of a snapshot name: what a sandbox was, and how to start one like it."""

    name: str
    tag: str
    source_sandbox: str
    # The template the source's disk is an overlay of (its backing file).
    template_id: str
    # False: a filesystem-only snapshot; sandboxes made from it start a fresh guest.
    memory: bool
    vcpus: int
    memory_mb: int
    # The guest kit the memory was saved with (a restored kernel keeps it mounted).
    kit: str
    # What a fresh guest on this disk is given at /init (env, user, workdir, command).
    guest: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    size: int = 0
    # Layers the upload diffs against (the source's last uploaded ones), and the layers of
    # this snapshot's files once uploaded (file name -> layer id; empty until then).
    base: dict[str, str] = field(default_factory=dict)
    stored: dict[str, str] = field(default_factory=dict)
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    # SNAPSHOT (of a sandbox), TEMPLATE (a template built from steps) or BUILD_CACHE (the
    # disk after one build step); only the first are listed as snapshots.
    kind: str = "snapshot"

    @property
    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at)

    @property
    def snapshot_id(self) -> str:
        return f"{self.name}:{self.tag}"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SnapshotRecord:
        return cls(**json.loads(data))


SNAPSHOT = "snapshot"
TEMPLATE = "template"
BUILD_CACHE = "buildcache"


def split_ref(ref: str) -> tuple[str, str]:
    """`name[:tag]` into its name and tag (the default tag when there is none)."""
    name, _, tag = ref.partition(":")
    return name, tag or DEFAULT_TAG


def new_name() -> str:
    return "s" + "".join(secrets.choice(_ALPHABET) for _ in range(15))


def new_tag() -> str:
    return "b" + secrets.token_hex(5)


def _key(name: str, tag: str) -> str:
    return f"snapshots/{name}/{tag}.json"


class SnapshotRegistry:
    """Snapshot records by name and tag; blocking, like the object store under it."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def save(self, record: SnapshotRecord) -> None:
        self._store.put(_key(record.name, record.tag), record.to_json())

    def builds(self, name: str) -> list[SnapshotRecord]:
        """Every build of `name`, oldest first; none for a name that is not a snapshot's."""
        if not valid_name(name):
            return []
        keys = self._store.list(f"snapshots/{name}/")
        return _oldest_first(self._load(keys))

    def find(self, ref: str) -> SnapshotRecord | None:
        name, tag = split_ref(ref)
        if tag == DEFAULT_TAG:
            builds = self.builds(name)
            return builds[-1] if builds else None
        if not (valid_name(name) and valid_name(tag)):
            return None
        try:
            return SnapshotRecord.from_json(self._store.get(_key(name, tag)))
        except ObjectNotFound:
            return None

    def lookup(self, ref: str) -> SnapshotRecord | None:
        """The snapshot `ref` names; None when its name is not a snapshot's (it may be an
        image's), NotFound when the name is a snapshot's but has no such build. One
        listing of the name: every create asks."""
        name, tag = split_ref(ref)
        if not valid_name(name):
            return None
        keys = self._store.list(f"snapshots/{name}/")
        if not keys:
            return None
        if tag == DEFAULT_TAG:
            builds = _oldest_first(self._load(keys))
            if builds:
                return builds[-1]
        elif _key(name, tag) in keys:
            try:
                return SnapshotRecord.from_json(self._store.get(_key(name, tag)))
            except ObjectNotFound:
                pass  # deleted meanwhile
        raise NotFound(f"snapshot {ref!r} not found")

    def get(self, ref: str) -> SnapshotRecord:
        record = self.find(ref)
        if record is None:
            raise NotFound(f"snapshot {ref!r} not found")
        return record

    def list(self) -> list[SnapshotRecord]:
        keys = [k for k in self._store.list("snapshots/") if k.endswith(".json")]
        return _oldest_first(self._load(keys))

    def delete(self, ref: str) -> list[SnapshotRecord]:
        """`name` forgets every build of the name, `name:tag` one build; what it removed."""
        if ":" in ref:
            gone = [self.get(ref)]
        else:
            gone = self.builds(ref)
            if not gone:
                raise NotFound(f"snapshot {ref!r} not found")
        for record in gone:
            self._store.delete(_key(record.name, record.tag))
        return gone

    def _load(self, keys: list[str]) -> list[SnapshotRecord]:
        records = []
        for key in keys:
            try:
                records.append(SnapshotRecord.from_json(self._store.get(key)))
            except ObjectNotFound:
                continue  # deleted while listing
        return records


def snapshot_names(record: SnapshotRecord, newest: bool) -> list[str]:
    """The ids that reach `record`: its own, and `name:default` while it is the newest."""
    if newest:
        return [record.snapshot_id, f"{record.name}:{DEFAULT_TAG}"]
    return [record.snapshot_id]


def newest_tags(records: list[SnapshotRecord]) -> dict[str, str]:
    """Each name's newest build's tag, from records oldest first."""
    return {record.name: record.tag for record in records}


def _oldest_first(records: list[SnapshotRecord]) -> list[SnapshotRecord]:
    return sorted(records, key=lambda r: (r.created_at, r.tag))
