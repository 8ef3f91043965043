"""The egress proxy's resolver: placeholders read as the E2B SDK describes them, secrets
of the moment, tokens for the sandbox and cached until shortly before they expire."""

from __future__ import annotations

import jwt
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentenv.credentials.identity import WorkloadIdentity
from agentenv.credentials.placeholders import Credentials, substitute
from agentenv.credentials.vault import SecretVault
from agentenv.net.transforms import HeaderValues, UnresolvedPlaceholder
from agentenv.state.credentials import SqlSecretStore, SqlSigningKeyStore
from agentenv.state.sandboxes import SandboxRecord

from .conftest import SEALER
from .test_identity import SETTINGS, Clock, sandbox, verify


class Sandboxes:
    """A node's records, as the resolver looks them up."""

    def __init__(self, *records: SandboxRecord) -> None:
        self.records = {r.sandbox_id: r for r in records}

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        return self.records.get(sandbox_id)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def credentials(engine: AsyncEngine, clock: Clock) -> Credentials:
    identity = WorkloadIdentity(SqlSigningKeyStore(engine), SEALER, SETTINGS, clock)
    vault = SecretVault(SqlSecretStore(engine), SEALER)
    return Credentials(vault, identity, Sandboxes(sandbox("i1"), sandbox("i2", {})), clock)


@pytest.mark.parametrize(
    ("value", "wanted"),
    [
        ("Bearer ${e2b.secrets.key}", [("secrets", "key")]),
        ("${e2b.identity.tokens.aws}", [("identity.tokens", "aws")]),
        # Everything up to the next "}": a brace in a name breaks it, as the SDK warns.
        ("${e2b.secrets.a}b}", [("secrets", "a")]),
        ("${e2b.identity.tokens.a{b}", [("identity.tokens", "a{b")]),
        ("${e2b.secrets.}", [("secrets", "")]),
        ("${e2b.secrets.a}${e2b.secrets.a} ${e2b.secrets.b}", [("secrets", "a"), ("secrets", "b")]),
    ],
)
async def test_placeholders_are_read_up_to_the_next_brace(
    value: str, wanted: list[tuple[str, str]]
) -> None:
    asked: list[tuple[str, str]] = []

    async def resolve(kind: str, name: str) -> str:
        asked.append((kind, name))
        return f"<{name}>"

    await substitute(value, resolve)
    assert asked == wanted


@pytest.mark.parametrize(
    "value",
    ["plain", "", "${e2b.secrets.open", "$e2b.secrets.x}", "${e2b.other.x}", "{e2b.secrets.x}"],
)
async def test_text_that_is_no_placeholder_passes_unchanged(
    credentials: Credentials, value: str
) -> None:
    assert await credentials.resolve("i1", value) == value


async def test_secrets_resolve_to_their_current_value(credentials: Credentials) -> None:
    resolver: HeaderValues = credentials
    await credentials.vault.create("Key", "s3cr3t", {})
    await credentials.vault.create("other", "${e2b.secrets.key}", {})
    assert await resolver.resolve("i1", "Bearer ${e2b.secrets.key}") == "Bearer s3cr3t"
    # Names in any case; two placeholders; a value is never read for placeholders.
    both = "${e2b.secrets.KEY}:${e2b.secrets.other}"
    assert await resolver.resolve("i1", both) == "s3cr3t:${e2b.secrets.key}"
    await credentials.vault.update("key", "rotated", None)
    assert await resolver.resolve("i1", "${e2b.secrets.key}") == "rotated"
    await credentials.vault.delete("key")
    with pytest.raises(UnresolvedPlaceholder) as refused:
        await resolver.resolve("i1", "Bearer ${e2b.secrets.key}")
    assert str(refused.value) == "${e2b.secrets.key}: no such secret"


@pytest.mark.parametrize(
    "value", ["${e2b.secrets.missing}", "${e2b.secrets.}", "ok ${e2b.secrets.a}b}"]
)
async def test_an_unknown_secret_is_refused(credentials: Credentials, value: str) -> None:
    with pytest.raises(UnresolvedPlaceholder, match="no such secret"):
        await credentials.resolve("i1", value)


async def test_an_id_does_not_stand_for_a_secret(credentials: Credentials) -> None:
    created = await credentials.vault.create("key", "v", {})
    with pytest.raises(UnresolvedPlaceholder):
        await credentials.resolve("i1", f"${{e2b.secrets.{created.secret_id}}}")


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\x00"])
async def test_a_value_a_header_cannot_carry_is_refused(
    credentials: Credentials, value: str
) -> None:
    await credentials.vault.create("key", value, {})
    with pytest.raises(UnresolvedPlaceholder, match="line break or NUL"):
        await credentials.resolve("i1", "${e2b.secrets.key}")


async def test_tokens_are_minted_for_the_sandbox_and_reused(
    credentials: Credentials, clock: Clock
) -> None:
    value = "Bearer ${e2b.identity.tokens.aws}"
    first = await credentials.resolve("i1", value)
    token = first.removeprefix("Bearer ")
    claims = verify(token, await credentials.identity.jwks())
    assert claims["sub"].endswith("/sandbox/i1") and claims["aud"] == "sts.amazonaws.com"
    assert await credentials.resolve("i1", value) == first
    # Reused while more than a fifth of its life is left, then minted again.
    clock.now += SETTINGS.token_ttl * 0.8 - 1
    assert await credentials.resolve("i1", value) == first
    clock.now += 2
    again = (await credentials.resolve("i1", value)).removeprefix("Bearer ")
    assert again != token
    assert jwt.decode(again, options={"verify_signature": False})["iat"] == int(clock.now)


@pytest.mark.parametrize(
    ("sandbox_id", "value", "text"),
    [
        ("i1", "${e2b.identity.tokens.gcp}", "registered no token of that name"),
        ("i1", "${e2b.identity.tokens.a{b}", "registered no token"),
        ("i1", "${e2b.identity.tokens.AWS}", "registered no token"),
        ("i2", "${e2b.identity.tokens.aws}", "registered no token"),
        ("gone", "${e2b.identity.tokens.aws}", "no such sandbox"),
    ],
)
async def test_a_token_the_sandbox_did_not_register_is_refused(
    credentials: Credentials, sandbox_id: str, value: str, text: str
) -> None:
    with pytest.raises(UnresolvedPlaceholder, match=text):
        await credentials.resolve(sandbox_id, value)
