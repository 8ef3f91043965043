"""Placeholders the egress proxy replaces in what a sandbox sends: `${e2b.secrets.NAME}`
(a hosted secret's value) and `${e2b.identity.tokens.NAME}` (a workload identity token).

The proxy receives a `HeaderValues` (built above this floor, `credentials/`): it only
knows this interface. A placeholder is read as the E2B SDK describes it
(`e2b/sandbox/iam.py`): everything between its prefix and the next `}`; text that is not
a placeholder passes unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..errors import Forbidden

SECRET = "secrets"
TOKEN = "identity.tokens"
_PLACEHOLDER = re.compile(r"\$\{e2b\.(secrets|identity\.tokens)\.([^}]*)\}")
# What a name in a placeholder cannot hold, as the SDK refuses: a brace would end or open
# the placeholder early, a control character cannot go into a header.
_NOT_IN_NAMES = re.compile(r"[{}\x00-\x1f\x7f-\x9f]")


class UnresolvedPlaceholder(Forbidden):
    """A placeholder names an unknown (or deleted) secret, or a token its sandbox did not
    register: the request carrying it must not go out."""

    def __init__(self, placeholder: str, reason: str) -> None:
        super().__init__(f"{placeholder}: {reason}")
        self.placeholder = placeholder


class HeaderValues(Protocol):
    """What the egress proxy calls for a header value of a sandbox's request."""

    async def resolve(self, sandbox_id: str, value: str) -> str:
        """`value` with every placeholder replaced; UnresolvedPlaceholder otherwise."""
        ...


async def substitute(value: str, resolve: Callable[[str, str], Awaitable[str]]) -> str:
    """`value` with each placeholder replaced by `resolve(kind, name)`, `kind` SECRET or
    TOKEN. One pass: text a placeholder resolves to is never read for placeholders."""
    wanted = {(m.group(1), m.group(2)) for m in _PLACEHOLDER.finditer(value)}
    if not wanted:
        return value
    resolved = {key: await resolve(*key) for key in sorted(wanted)}
    return _PLACEHOLDER.sub(lambda m: resolved[(m.group(1), m.group(2))], value)


def usable_name(name: str) -> bool:
    """Whether a secret or token of this name can be named by a placeholder."""
    return bool(name) and not _NOT_IN_NAMES.search(name)


def placeholder(kind: str, name: str) -> str:
    """The placeholder text for a secret or token `name`."""
    return f"${{e2b.{kind}.{name}}}"
