"""A node's hosted credentials, and the resolver its egress proxy calls (`HeaderValues`,
`net/transforms.py`): secrets by name, identity tokens by the sandbox's registered
names, minted for that sandbox and reused until shortly before they expire.

A placeholder is read as the E2B SDK describes it (`e2b/sandbox/iam.py`): everything
between `${e2b.secrets.` or `${e2b.identity.tokens.` and the next `}`; text that is not
a placeholder passes unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from ..net.transforms import PLACEHOLDER, UnresolvedPlaceholder
from ..state.credentials import SqlSecretStore, SqlSigningKeyStore
from ..state.sandboxes import SandboxRecord
from .identity import IdentitySettings, MintedToken, WorkloadIdentity
from .sealing import Sealer, SealError
from .vault import SecretVault

log = logging.getLogger(__name__)

SECRET = "secrets"

# A cached token is minted again once it has less than this share of its life left.
_REFRESH_SHARE = 0.2
# Tokens cached at most (sandboxes times their token names); past it, expired ones go.
_MAX_CACHED = 10_000
# A header value cannot carry these: a secret holding one is refused, not sent.
_NOT_IN_HEADERS = ("\r", "\n", "\x00")


def placeholder(kind: str, name: str) -> str:
    """The placeholder text for a secret or token `name` (`kind`: SECRET, or the tokens')."""
    return f"${{e2b.{kind}.{name}}}"


async def substitute(value: str, resolve: Callable[[str, str], Awaitable[str]]) -> str:
    """`value` with each placeholder replaced by `resolve(kind, name)`. One pass: text a
    placeholder resolves to is never read for placeholders."""
    wanted = {(m.group(1), m.group(2)) for m in PLACEHOLDER.finditer(value)}
    if not wanted:
        return value
    resolved = {key: await resolve(*key) for key in sorted(wanted)}
    return PLACEHOLDER.sub(lambda m: resolved[(m.group(1), m.group(2))], value)


def _unresolved(kind: str, name: str, reason: str) -> UnresolvedPlaceholder:
    return UnresolvedPlaceholder(f"{placeholder(kind, name)}: {reason}")


class SandboxLookup(Protocol):
    """The node's sandbox records (a `SandboxStore`)."""

    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...


class Credentials:
    """Secrets and workload identity over one state store; `resolve` is the egress
    proxy's `HeaderValues`."""

    def __init__(
        self,
        vault: SecretVault,
        identity: WorkloadIdentity,
        sandboxes: SandboxLookup,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.vault = vault
        self.identity = identity
        self._sandboxes = sandboxes
        self._clock = clock
        self._tokens: dict[tuple[str, str, str], MintedToken] = {}

    @classmethod
    def on(
        cls,
        engine: AsyncEngine,
        sandboxes: SandboxLookup,
        sealer: Sealer,
        settings: IdentitySettings,
    ) -> Credentials:
        """Over the state store of `engine`."""
        identity = WorkloadIdentity(SqlSigningKeyStore(engine), sealer, settings)
        return cls(SecretVault(SqlSecretStore(engine), sealer), identity, sandboxes)

    async def open(self) -> None:
        """Everything sealed with a former server key moves to the current one; the
        signing keys are made or rotated as due."""
        moved = await self.vault.reseal() + await self.identity.reseal()
        if moved:
            log.info("credentials: %d sealed with a former server key, resealed", moved)
        await self.identity.maintain()

    async def resolve(self, sandbox_id: str, value: str) -> str:
        """`value` with its placeholders replaced for the sandbox; UnresolvedPlaceholder
        for an unknown or deleted secret, or a token name the sandbox did not register."""

        async def one(kind: str, name: str) -> str:
            if kind != SECRET:
                return await self._token(sandbox_id, kind, name)
            try:
                resolved = await self.vault.value(name)
            except SealError as exc:  # a server key this node lacks: the request stays in
                raise _unresolved(kind, name, str(exc)) from None
            if resolved is None:
                raise _unresolved(kind, name, "no such secret")
            if any(c in resolved for c in _NOT_IN_HEADERS):
                reason = "its value holds a line break or NUL, which a header cannot carry"
                raise _unresolved(kind, name, reason)
            return resolved

        return await substitute(value, one)

    async def _token(self, sandbox_id: str, kind: str, name: str) -> str:
        record = await self._sandboxes.get(sandbox_id)
        if record is None:
            raise _unresolved(kind, name, "no such sandbox on this node")
        definition = record.iam.get("tokens", {}).get(name)
        if definition is None:
            raise _unresolved(kind, name, f"sandbox {sandbox_id} registered no token of that name")
        key = (sandbox_id, name, definition["audience"])
        now = self._clock()
        cached = self._tokens.get(key)
        refresh = self.identity.settings.token_ttl * _REFRESH_SHARE
        if cached is not None and cached.expires_at - now > refresh:
            return cached.token
        minted = await self.identity.mint(record, name)
        if len(self._tokens) >= _MAX_CACHED:
            self._tokens = {k: t for k, t in self._tokens.items() if t.expires_at > now}
            if len(self._tokens) >= _MAX_CACHED:
                self._tokens.clear()
        self._tokens[key] = minted
        return minted.token
