"""Snapshots are templates, as in E2B: a name with one build per snapshot taken under it.

A snapshot's id is `name:tag`; `name` and `name:default` mean the name's newest build.
A build may also carry tags given to it (E2B's template tags: `name:v1` names the build
tagged `v1`; a `default` tag, once given, is what `name` means). Records live in the
object store next to template records, so every node sees them.
"""

from __future__ import annotations

import builtins
import json
import secrets
import string
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errors import InvalidInput, NotFound
from ..storage.objectstore import ObjectNotFound, ObjectStore
from .templates import build_uuid, tag_not_found, valid_name

DEFAULT_TAG = "default"
# Assignments kept in a tag's history (E2B lists them; the first is the tag's build).
_KEPT_ASSIGNMENTS = 100
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
    # When a build last started from this BUILD_CACHE entry; empty: never since taken.
    used_at: str = ""

    @property
    def created(self) -> datetime:
        return datetime.fromisoformat(self.created_at)

    @property
    def last_used(self) -> datetime:
        return datetime.fromisoformat(self.used_at or self.created_at)

    @property
    def snapshot_id(self) -> str:
        return f"{self.name}:{self.tag}"

    @property
    def build_uuid(self) -> str:
        """The build as E2B names builds (a UUID), derived from its id."""
        return build_uuid(self.snapshot_id)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> SnapshotRecord:
        return cls(**json.loads(data))


SNAPSHOT = "snapshot"
TEMPLATE = "template"
BUILD_CACHE = "buildcache"


def validate_tags(tags: list[str]) -> list[str]:
    """Tags as E2B takes them (trimmed, lower case), each once; InvalidInput otherwise."""
    clean: list[str] = []
    for raw in tags:
        tag = raw.strip().lower()
        if not valid_name(tag) or _is_uuid(tag):
            raise InvalidInput(
                f"tag {raw!r}: 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or "
                "digit (and not a UUID: those name builds)"
            )
        if tag not in clean:
            clean.append(tag)
    return clean


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


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


def _tag_key(name: str, tag: str) -> str:
    return f"snapshot-tags/{name}/{tag}.json"


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
        if not (valid_name(name) and valid_name(tag)):
            return None
        try:
            return SnapshotRecord.from_json(self._store.get(_key(name, tag)))
        except ObjectNotFound:
            pass
        tagged = self._tagged(name, tag)
        if tagged is not None or tag != DEFAULT_TAG:
            return tagged
        builds = self.builds(name)
        return builds[-1] if builds else None

    def lookup(self, ref: str) -> SnapshotRecord | None:
        """The snapshot `ref` names; None when its name is not a snapshot's (it may be a
        template's), NotFound in E2B's words when the name is a snapshot's but has no such
        build."""
        name, tag = split_ref(ref)
        if not valid_name(name) or not self._store.list(f"snapshots/{name}/"):
            return None
        found = self.find(ref)
        if found is None:
            raise tag_not_found(name, tag)
        return found

    def _tagged(self, name: str, tag: str) -> SnapshotRecord | None:
        """The build tag `tag` was given to, if any."""
        try:
            build = json.loads(self._store.get(_tag_key(name, tag)))["build"]
            return SnapshotRecord.from_json(self._store.get(_key(name, build)))
        except (ObjectNotFound, KeyError, ValueError):
            return None

    def tag(self, record: SnapshotRecord, tags: list[str]) -> None:
        """Give `tags` to the build `record` (each moves from any build that had it; the
        builds it had before stay in its history, E2B's assignments)."""
        for tag in tags:
            key = _tag_key(record.name, tag)
            entry = {"build": record.tag, "createdAt": datetime.now(UTC).isoformat()}
            history = [entry, *self._history(key)][:_KEPT_ASSIGNMENTS]
            self._store.put(key, json.dumps({**entry, "assignments": history}).encode())

    def _history(self, key: str) -> builtins.list[dict[str, str]]:
        """A tag's assignments, newest first (a tag saved before they were kept has one)."""
        try:
            data = json.loads(self._store.get(key))
            return data.get("assignments") or [
                {"build": data["build"], "createdAt": data["createdAt"]}
            ]
        except (ObjectNotFound, KeyError, ValueError):
            return []

    def assignments(self, name: str) -> dict[str, builtins.list[tuple[SnapshotRecord, str]]]:
        """Each tag of `name` with the builds it was given to that still exist, newest
        first, and when it was given to each."""
        builds = {build.tag: build for build in self.builds(name)}
        found: dict[str, builtins.list[tuple[SnapshotRecord, str]]] = {}
        for key in self._store.list(f"snapshot-tags/{name}/") if builds else []:
            history = self._history(key)
            ready = [(builds[e["build"]], e["createdAt"]) for e in history if e["build"] in builds]
            if ready:
                found[key.rsplit("/", 1)[1].removesuffix(".json")] = ready
        return found

    def untag(self, name: str, tags: list[str]) -> None:
        for tag in tags:
            self._store.delete(_tag_key(name, tag))

    def tags(self, name: str) -> list[tuple[str, SnapshotRecord, str]]:
        """(tag, build, when given) of every tag of `name`, oldest given first."""
        found = []
        for key in self._store.list(f"snapshot-tags/{name}/"):
            tag = key.rsplit("/", 1)[1].removesuffix(".json")
            try:
                when = json.loads(self._store.get(key))["createdAt"]
            except (ObjectNotFound, KeyError, ValueError):
                continue
            record = self._tagged(name, tag)
            if record is not None:
                found.append((tag, record, when))
        return sorted(found, key=lambda item: item[2])

    def get(self, ref: str) -> SnapshotRecord:
        record = self.find(ref)
        if record is None:
            raise NotFound(f"snapshot {ref!r} not found")
        return record

    def list(self, name_prefix: str = "") -> list[SnapshotRecord]:
        """Every build of every name that starts with `name_prefix`, oldest first."""
        keys = [k for k in self._store.list(f"snapshots/{name_prefix}") if k.endswith(".json")]
        return _oldest_first(self._load(keys))

    def delete(self, ref: str) -> builtins.list[SnapshotRecord]:
        """`name` forgets every build of the name, `name:tag` one build; what it removed."""
        if ":" in ref:
            gone = [self.get(ref)]
        else:
            gone = self.builds(ref)
            if not gone:
                raise NotFound(f"snapshot {ref!r} not found")
        for record in gone:
            for tag, tagged, _ in self.tags(record.name):
                if tagged.tag == record.tag:
                    self._store.delete(_tag_key(record.name, tag))
            self._store.delete(_key(record.name, record.tag))
        return gone

    def _load(self, keys: builtins.list[str]) -> builtins.list[SnapshotRecord]:
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
