"""Secrets and signing keys in the state store, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from agentenv.errors import Conflict
from agentenv.state.credentials import (
    Sealed,
    SecretRecord,
    SigningKeyRecord,
    SqlSecretStore,
    SqlSigningKeyStore,
)
from agentenv.state.sandboxes import SqlSandboxStore, open_engine

from .test_sandboxes import _record

START = datetime(2026, 1, 1, tzinfo=UTC)


def _secret(secret_id: str, name: str, at: datetime = START) -> SecretRecord:
    return SecretRecord(secret_id, name, 1, {"team": "a"}, at, at, Sealed("k1", b"\x00sealed"))


def _key(kid: str, generation: int) -> SigningKeyRecord:
    return SigningKeyRecord(
        kid, generation, "ES256", {"kid": kid}, 1.0, 2.0 * generation, Sealed("k1", b"der")
    )


async def test_secrets_round_trip_version_and_delete(state_url: str) -> None:
    engine = await open_engine(state_url)
    store = SqlSecretStore(engine)
    await store.insert(_secret("sec_1", "one"))
    with pytest.raises(Conflict, match="'one' already exists"):
        await store.insert(_secret("sec_2", "one"))
    assert await store.find("sec_1") == await store.find("one") == _secret("sec_1", "one")
    later = START + timedelta(seconds=5)
    updated = await store.replace_value("sec_1", Sealed("k2", b"new"), None, later)
    assert updated is not None
    assert (updated.version, updated.metadata, updated.value) == (
        2,
        {"team": "a"},
        Sealed("k2", b"new"),
    )
    assert (updated.created_at, updated.updated_at) == (START, later)
    updated = await store.replace_value("sec_1", Sealed("k2", b"3"), {}, later)
    assert updated is not None and (updated.version, updated.metadata) == (3, {})
    assert await store.replace_value("sec_x", Sealed("k2", b"3"), {}, later) is None
    # A reseal only replaces the value it was computed from.
    assert not await store.reseal("sec_1", Sealed("k2", b"new"), Sealed("k3", b"x"))
    assert await store.reseal("sec_1", Sealed("k2", b"3"), Sealed("k3", b"x"))
    assert (await store.find("one")).value == Sealed("k3", b"x")  # type: ignore[union-attr]
    assert await store.delete("sec_1") and not await store.delete("sec_1")
    assert await store.find("one") is None
    await engine.dispose()


async def test_secrets_page_oldest_first_from_a_cursor(state_url: str) -> None:
    engine = await open_engine(state_url)
    store = SqlSecretStore(engine)
    # Two with the same time: the id orders them; a time with microseconds sorts after.
    times = [START, START, START + timedelta(microseconds=1), START + timedelta(seconds=1)]
    for i, at in enumerate(times):
        await store.insert(_secret(f"sec_{i}", f"n{i}", at))
    first = await store.page(2, None)
    assert [r.secret_id for r in first] == ["sec_0", "sec_1"]
    rest = await store.page(2, (first[-1].created_at, first[-1].secret_id))
    assert [r.secret_id for r in rest] == ["sec_2", "sec_3"]
    assert await store.page(2, (rest[-1].created_at, rest[-1].secret_id)) == []
    assert len(await store.list()) == 4
    await engine.dispose()


async def test_signing_keys_one_per_generation(state_url: str) -> None:
    engine = await open_engine(state_url)
    store = SqlSigningKeyStore(engine)
    added = await asyncio.gather(store.add(_key("a", 1)), store.add(_key("b", 1)))
    assert sorted(added) == [False, True]
    assert await store.add(_key("c", 2))
    keys = await store.list()
    assert [k.generation for k in keys] == [1, 2] and keys[1] == _key("c", 2)
    assert await store.reseal("c", Sealed("k1", b"der"), Sealed("k2", b"der2"))
    await store.remove([keys[0].kid])
    assert [k.private_key for k in await store.list()] == [Sealed("k2", b"der2")]
    await engine.dispose()


async def test_a_sandbox_keeps_its_identity_tokens(state_url: str) -> None:
    store = await SqlSandboxStore.open(state_url, "n1")
    iam = {"tokens": {"aws": {"audience": "sts.amazonaws.com", "tokenType": "JWT-SVID"}}}
    await store.insert(dataclasses.replace(_record("a", 0), iam=iam))
    await store.insert(_record("b", 1))
    assert (await store.get("a")).iam == iam  # type: ignore[union-attr]
    assert (await store.get("b")).iam == {}  # type: ignore[union-attr]
    await store.close()
