"""Workload identity over a real SQLite store: minting, key life, rotation, settings."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentenv.config import Config, ConfigError
from agentenv.credentials.identity import (
    CLOCK_MARGIN,
    IdentitySettings,
    PublicKeys,
    WorkloadIdentity,
)
from agentenv.credentials.sealing import Sealer, derive_key
from agentenv.state.credentials import SqlSigningKeyStore
from agentenv.state.lifecycle import State
from agentenv.state.sandboxes import SandboxRecord

from .conftest import SEALER

SETTINGS = IdentitySettings("https://aenv.example.test", "aenv.example.test", 300, 86400, 600)
START = datetime(2026, 1, 1, tzinfo=UTC)
AWS = {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}


def sandbox(sandbox_id: str = "i1", tokens: dict[str, Any] | None = None) -> SandboxRecord:
    return SandboxRecord(
        sandbox_id, "tpl1", State.RUNNING, START, START + timedelta(hours=1), 1, 256, 4096, 0,
        iam={"tokens": {"aws": AWS} if tokens is None else tokens},
    )  # fmt: skip


class Clock:
    """Real time to start with, so PyJWT's own checks of `iat` and `exp` agree."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def verify(token: str, jwks: dict[str, Any], at: float | None = None) -> dict[str, Any]:
    """The claims, checked by PyJWT against `jwks` (at a time of the test's clock)."""
    kid = jwt.get_unverified_header(token)["kid"]
    keys = {key.key_id: key for key in jwt.PyJWKSet.from_dict(jwks).keys}
    assert kid in keys, f"key {kid} is not in the JWKS"
    options = {} if at is None else {"verify_exp": False, "verify_iat": False}
    claims: dict[str, Any] = jwt.decode(
        token, keys[kid], algorithms=["ES256"], audience=AWS["audience"], options=options
    )
    if at is not None:
        assert claims["iat"] <= at < claims["exp"]
    return claims


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def identity(engine: AsyncEngine, clock: Clock) -> WorkloadIdentity:
    return WorkloadIdentity(SqlSigningKeyStore(engine), SEALER, SETTINGS, clock)


async def test_a_minted_token_is_a_jwt_svid_for_its_sandbox(identity: WorkloadIdentity) -> None:
    await identity.maintain()
    minted = await identity.mint(sandbox(), "aws")
    claims = verify(minted.token, await identity.jwks())
    assert claims["iss"] == "https://aenv.example.test"
    assert claims["sub"] == "spiffe://aenv.example.test/sandbox/i1"
    assert claims["aud"] == "sts.amazonaws.com"
    assert claims["exp"] - claims["iat"] == 300 and claims["exp"] == minted.expires_at
    assert (claims["sandbox_id"], claims["template_id"], claims["team_id"]) == (
        "i1",
        "tpl1",
        "default",
    )
    assert (
        claims["jti"]
        != verify((await identity.mint(sandbox(), "aws")).token, await identity.jwks())["jti"]
    )
    assert jwt.get_unverified_header(minted.token)["alg"] == "ES256"
    with pytest.raises(KeyError):
        await identity.mint(sandbox(), "gcp")


async def test_a_mint_before_any_key_makes_the_first(identity: WorkloadIdentity) -> None:
    minted = await identity.mint(sandbox(), "aws")
    verify(minted.token, await identity.jwks())
    assert [state for _, state in await identity.keys()] == ["signing"]


async def test_rotation_publishes_ahead_and_retires_after_the_last_token(
    identity: WorkloadIdentity, clock: Clock
) -> None:
    await identity.maintain()
    before = await identity.mint(sandbox(), "aws")
    new = await identity.rotate()
    assert new.active_at == clock.now + SETTINGS.publish_ahead
    # Pending: in the JWKS, not signing yet.
    assert [state for _, state in await identity.keys()] == ["signing", "pending"]
    verify(before.token, await identity.jwks())
    clock.now = new.active_at - 1
    last_old = await identity.mint(sandbox(), "aws")
    assert jwt.get_unverified_header(last_old.token)["kid"] != new.kid
    verify(last_old.token, await identity.jwks(), at=clock.now)

    clock.now = new.active_at
    after = await identity.mint(sandbox(), "aws")
    assert jwt.get_unverified_header(after.token)["kid"] == new.kid
    jwks = await identity.jwks()
    assert [state for _, state in await identity.keys()] == ["retiring", "signing"]
    verify(last_old.token, jwks, at=clock.now)
    verify(after.token, jwks, at=clock.now)
    # A token the old key signed last is valid for its whole life; the old key stays.
    clock.now = new.active_at + SETTINGS.token_ttl + CLOCK_MARGIN - 1
    await identity.maintain()
    assert len((await identity.jwks())["keys"]) == 2
    clock.now += 1
    await identity.maintain()
    assert [k["kid"] for k in (await identity.jwks())["keys"]] == [new.kid]
    assert len(await identity.store.list()) == 1


async def test_keys_rotate_on_their_own_when_the_period_is_over(
    identity: WorkloadIdentity, clock: Clock
) -> None:
    await identity.maintain()
    first = (await identity.store.list())[0]
    clock.now += SETTINGS.rotation_period - SETTINGS.publish_ahead - 1
    await identity.maintain()
    assert len(await identity.store.list()) == 1
    clock.now += 1
    await identity.maintain()
    keys = await identity.store.list()
    # Published now, signing exactly one period after the first began.
    assert [k.generation for k in keys] == [1, 2]
    assert keys[1].active_at == first.active_at + SETTINGS.rotation_period
    await identity.maintain()
    assert len(await identity.store.list()) == 2


async def test_nodes_keeping_keys_at_once_make_one_of_each(
    engine: AsyncEngine, clock: Clock
) -> None:
    nodes = [WorkloadIdentity(SqlSigningKeyStore(engine), SEALER, SETTINGS, clock) for _ in "ab"]
    await asyncio.gather(*(node.maintain() for node in nodes))
    assert len(await nodes[0].store.list()) == 1
    # Any node mints with the key another made, and the public side needs no server key.
    token = (await nodes[1].mint(sandbox(), "aws")).token
    public = PublicKeys(SqlSigningKeyStore(engine), SETTINGS, clock)
    verify(token, await public.jwks())


async def test_a_new_server_key_reseals_the_signing_keys(
    engine: AsyncEngine, identity: WorkloadIdentity, clock: Clock
) -> None:
    await identity.maintain()
    token = (await identity.mint(sandbox(), "aws")).token
    rotated = Sealer(derive_key("another server key" * 2), (derive_key("test server key " * 2),))
    moved = WorkloadIdentity(SqlSigningKeyStore(engine), rotated, SETTINGS, clock)
    assert await moved.reseal() == 1 and await moved.reseal() == 0
    assert [k.private_key.key_id for k in await moved.store.list()] == [rotated.key_id]
    jwks = await moved.jwks()
    verify(token, jwks)
    verify((await moved.mint(sandbox(), "aws")).token, jwks)


def _settings(**given: Any) -> IdentitySettings:
    cfg = Config()
    for section_key, value in given.items():
        section, key = section_key.split("__")
        setattr(getattr(cfg, section), key, value)
    return IdentitySettings.of(cfg)


def test_the_issuer_comes_from_the_config_the_domain_or_the_address() -> None:
    assert _settings().issuer == "http://127.0.0.1:8000"
    assert _settings().trust_domain == "127.0.0.1"
    with_domain = _settings(server__domain="sandboxes.example.test")
    assert with_domain.issuer == "https://api.sandboxes.example.test"
    assert with_domain.trust_domain == "api.sandboxes.example.test"
    given = _settings(identity__issuer="https://ID.example.test/", identity__trust_domain="Corp")
    assert (given.issuer, given.trust_domain) == ("https://ID.example.test", "corp")
    assert given.discovery()["jwks_uri"] == "https://ID.example.test/.well-known/jwks.json"
    assert _settings(identity__publish_ahead=30.0).jwks_max_age == 15
    assert _settings().jwks_max_age == 300


@pytest.mark.parametrize(
    ("given", "text"),
    [
        ({"identity__issuer": "ftp://x"}, "an http"),
        ({"identity__trust_domain": "a/b"}, "trust_domain"),
        ({"identity__token_ttl": 5}, "token_ttl"),
        ({"identity__publish_ahead": -1.0}, "negative"),
        ({"identity__rotation_period": 60.0}, "longer than publish_ahead"),
    ],
)
def test_settings_that_cannot_work_are_refused(given: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError, match=text):
        _settings(**given)
