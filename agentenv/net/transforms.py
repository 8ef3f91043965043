"""Per-domain header transforms on a sandbox's outbound HTTPS requests (E2B's
`network.rules`): which headers the node's egress proxy sets on a request to a host.

Keys are exact names (`api.example.com`) or a leading wildcard (`*.example.com`, any depth
of subdomain, never the apex). An exact key wins, then the longest matching wildcard; the
matching key's rules apply in order and other keys' rules are not merged in. Rules grant no
access: `allowOut` decides what the sandbox may reach.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import InvalidInput
from .dns import is_dns_name

# Per sandbox; each key is matched for every HTTPS request it makes.
MAX_PATTERNS = 64
# E2B's placeholders: `${e2b.secrets.NAME}`, `${e2b.identity.tokens.NAME}`; a name runs to
# the next `}`.
PLACEHOLDER = re.compile(r"\$\{e2b\.(secrets|identity\.tokens)\.([^}]*)\}")


class UnresolvedPlaceholder(Exception):
    """A header value names a secret or token that does not exist (for this sandbox)."""


class HeaderValues(Protocol):
    """Resolves the placeholders of a rule's header value, for one sandbox, at egress."""

    async def resolve(self, sandbox_id: str, value: str) -> str: ...


@dataclass(frozen=True)
class HeaderRules:
    """Host pattern (lower case) -> the headers its rules set, in rule order."""

    headers_by_pattern: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.headers_by_pattern)

    def headers_for(self, host: str) -> tuple[tuple[str, str], ...] | None:
        """The headers to set on a request to `host` (lower case); None: no rule matches."""
        exact = self.headers_by_pattern.get(host)
        if exact is not None:
            return exact
        best: str | None = None
        for pattern in self.headers_by_pattern:
            suffix = pattern[1:]  # ".example.com" of "*.example.com"
            if pattern.startswith("*.") and host.endswith(suffix) and len(host) > len(suffix):
                if best is None or len(pattern) > len(best):
                    best = pattern
        return None if best is None else self.headers_by_pattern[best]


def normalize_rules(rules: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """E2B's rules as stored: keys checked and lower-cased; InvalidInput names a bad key."""
    if len(rules) > MAX_PATTERNS:
        raise InvalidInput(f"network.rules: at most {MAX_PATTERNS} keys, {len(rules)} given")
    normalized: dict[str, list[dict[str, Any]]] = {}
    for key, entries in rules.items():
        pattern = key.strip().lower().rstrip(".")
        if not _is_pattern(pattern):
            raise InvalidInput(
                f"network.rules: {key!r} is neither a DNS name nor a leading wildcard"
                " ('*.example.com'); a bare '*' is invalid"
            )
        if pattern in normalized:
            raise InvalidInput(f"network.rules: {key!r} is given twice")
        normalized[pattern] = entries
    return normalized


def header_rules(rules: Mapping[str, list[dict[str, Any]]]) -> HeaderRules:
    """The transforms of stored (normalized) rules."""
    by_pattern = {}
    for pattern, entries in rules.items():
        headers: list[tuple[str, str]] = []
        for rule in entries:
            transform = rule.get("transform") or {}
            headers += (transform.get("headers") or {}).items()
        by_pattern[pattern] = tuple(headers)
    return HeaderRules(by_pattern)


def _is_pattern(pattern: str) -> bool:
    return is_dns_name(pattern.removeprefix("*."))


class LiteralValues:
    """Header values as written, for a node without a credential store: a placeholder in
    one is unresolved."""

    async def resolve(self, sandbox_id: str, value: str) -> str:
        found = PLACEHOLDER.search(value)
        if found is not None:
            raise UnresolvedPlaceholder(f"{found.group(0)} cannot be resolved on this server")
        return value
