"""Pulled templates: their records live in the object store, so every node sees them."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from ..errors import InvalidInput, NotFound
from ..storage.objectstore import ObjectNotFound, ObjectStore

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# E2B names builds by UUID: ours are version-5 UUIDs, in this namespace, of what they hold.
_BUILD_NAMESPACE = uuid.UUID("6f1c1d0e-2b47-4d55-9a57-3f0e4b0a7c21")


def build_uuid(build: str) -> str:
    """The UUID of the build `build` names (a snapshot id, a template at its digest)."""
    return str(uuid.uuid5(_BUILD_NAMESPACE, build))


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def validate_name(name: str) -> str:
    if not valid_name(name):
        raise InvalidInput(
            f"template name {name!r} must be 1-63 of a-z, 0-9, '.', '_', '-' and start with "
            "a letter or digit"
        )
    return name


def template_not_found(ref: str) -> NotFound:
    """E2B's 404 for a name that is no template (the name without its tag, when it has
    one); an image reference gets a hint, since a create never pulls one by itself."""
    if "/" in ref or "@" in ref:
        return NotFound(
            f"template '{ref}' not found (an image is pulled first: `aenv pull`, "
            "POST /templates/pull)"
        )
    name, _, _ = ref.partition(":")
    return NotFound(f"template '{name if valid_name(name) else ref}' not found")


def tag_not_found(name: str, tag: str) -> NotFound:
    """E2B's 404 for a template that has no build with that tag."""
    return NotFound(f"tag '{tag}' does not exist for template '{name}'")


@dataclass
class TemplateRecord:
    """A template made from an OCI image: its block layers and the config a sandbox honours."""

    template_id: str
    source: str
    digest: str
    layers: list[str]
    size: int
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""
    user: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    # Sandbox size set by the template's build (E2B's cpuCount/memoryMB); None: the server's.
    vcpus: int | None = None
    memory_mb: int | None = None

    @property
    def build_uuid(self) -> str:
        """Its one build, as E2B names builds: pulling new content makes a new one."""
        return build_uuid(f"{self.template_id}@{self.digest}")

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TemplateRecord:
        return cls(**json.loads(data))


def _key(template_id: str) -> str:
    return f"templates/{template_id}.json"


def _public_key(name: str) -> str:
    return f"template-public/{name}"


class TemplateRegistry:
    """Template records by name; blocking, like the object store under it."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def save(self, record: TemplateRecord) -> None:
        self.store.put(_key(validate_name(record.template_id)), record.to_json())

    def get(self, template_id: str) -> TemplateRecord:
        if not valid_name(template_id):  # no template can have it; never a store key
            raise template_not_found(template_id)
        try:
            return TemplateRecord.from_json(self.store.get(_key(template_id)))
        except ObjectNotFound:
            raise template_not_found(template_id) from None

    def find(self, template_id: str) -> TemplateRecord | None:
        try:
            return self.get(template_id)
        except NotFound:
            return None

    def list(self) -> list[TemplateRecord]:
        keys = self.store.list("templates/")
        return [TemplateRecord.from_json(self.store.get(k)) for k in keys if k.endswith(".json")]

    def delete(self, template_id: str) -> None:
        """Forget the template; its layers stay, shared with other templates."""
        self.get(template_id)
        self.store.delete(_key(template_id))

    def public_names(self) -> set[str]:
        """The templates (of any kind) made public, `PATCH /templates/{id}`."""
        return {key.rsplit("/", 1)[1] for key in self.store.list("template-public/")}

    def set_public(self, name: str, public: bool) -> None:
        """Beside the records, so every node sees it; a forgotten name is not public."""
        key = _public_key(validate_name(name))
        if public:
            self.store.put(key, b"public")
        else:
            self.store.delete(key)
