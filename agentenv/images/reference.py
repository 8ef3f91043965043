"""Image references (`ubuntu`, `ghcr.io/o/r:tag`, `repo@sha256:...`) parsed the way Docker does."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidInput

__all__ = ["DEFAULT_REGISTRY", "DEFAULT_TAG", "ImageRef", "full_reference", "parse_reference"]

DEFAULT_REGISTRY = "docker.io"
DEFAULT_TAG = "latest"
# Docker Hub's name is docker.io but its API lives elsewhere; old spellings alias it.
_DOCKER_HUB_API = "registry-1.docker.io"
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
_MAX_NAME = 255


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference; `digest`, when set, wins over `tag` for fetching."""

    registry: str
    repository: str
    tag: str | None = DEFAULT_TAG
    digest: str | None = None

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text

    @property
    def api_host(self) -> str:
        """The host:port that serves `/v2/` for this registry."""
        return _DOCKER_HUB_API if self.registry == DEFAULT_REGISTRY else self.registry

    @property
    def reference(self) -> str:
        """What goes after `/manifests/`: the digest if pinned, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    def with_digest(self, digest: str) -> ImageRef:
        """The same image pinned to `digest` (the tag is kept for display)."""
        return ImageRef(self.registry, self.repository, self.tag, digest)


def parse_reference(text: str) -> ImageRef:
    """Parse `[host[:port]/]path[:tag][@digest]`; raise InvalidInput naming what is wrong."""
    if not isinstance(text, str) or not text or text != text.strip():
        raise InvalidInput(f"invalid image reference {text!r}: empty or surrounded by spaces")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise InvalidInput(
                f"invalid image reference {text!r}: digest must be sha256:<64 hex> "
                "or sha512:<128 hex>"
            )
    tag = None
    # A colon after the last slash is a tag; one before it belongs to host:port.
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise InvalidInput(f"invalid image reference {text!r}: bad tag {tag!r}")
    registry, path = _split_registry(rest, text)
    components = path.split("/")
    for part in components:
        if not _COMPONENT.fullmatch(part):
            raise InvalidInput(
                f"invalid image reference {text!r}: repository component {part!r} must be "
                "lowercase letters, digits and single separators (. _ __ -)"
            )
    if registry == DEFAULT_REGISTRY and len(components) == 1:
        path = f"library/{path}"
    if len(registry) + 1 + len(path) > _MAX_NAME:
        raise InvalidInput(f"invalid image reference {text!r}: name longer than {_MAX_NAME}")
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return ImageRef(registry, path, tag, digest)


def full_reference(text: str) -> ImageRef | None:
    """`text` parsed when it is a full reference, one that names its registry's host
    (`localhost:5000/app:v1`, `docker.io/library/ubuntu`); None for anything else, a
    short Docker Hub name (`ubuntu:22.04`) included: that is a template's `name:tag`."""
    first, sep, _ = text.partition("/")
    if not (sep and _is_host(first)):
        return None
    try:
        return parse_reference(text)
    except InvalidInput:
        return None


def _is_host(first: str) -> bool:
    """Docker's rule: a first component is a host if it has a dot, a port, or is localhost."""
    return "." in first or ":" in first or first == "localhost" or first[:1] == "["


def _split_registry(rest: str, text: str) -> tuple[str, str]:
    """Split off the host, when the first component is one."""
    first, sep, remainder = rest.partition("/")
    if not (sep and _is_host(first)):
        if not rest:
            raise InvalidInput(f"invalid image reference {text!r}: missing repository")
        return DEFAULT_REGISTRY, rest
    if not _HOST.fullmatch(first):
        raise InvalidInput(f"invalid image reference {text!r}: bad registry host {first!r}")
    if not remainder:
        raise InvalidInput(f"invalid image reference {text!r}: missing repository")
    host = first.lower()
    if host in _DOCKER_HUB_ALIASES:
        host = DEFAULT_REGISTRY
    return host, remainder
