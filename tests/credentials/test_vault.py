"""Hosted secrets over a real SQLite store: names, metadata bounds, versions, values."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentenv.credentials.vault import (
    MAX_METADATA_BYTES,
    MAX_METADATA_ENTRIES,
    MAX_METADATA_KEY_BYTES,
    MAX_METADATA_VALUE_BYTES,
    MAX_NAME_CHARS,
    MAX_VALUE_BYTES,
    SecretVault,
)
from agentenv.errors import Conflict, InvalidInput, NotFound
from agentenv.state.credentials import SqlSecretStore

from .conftest import SEALER

VALUE = "sk-live-0123456789abcdef"


@pytest.fixture
def vault(engine: AsyncEngine) -> SecretVault:
    return SecretVault(SqlSecretStore(engine), SEALER)


async def test_create_get_update_delete(vault: SecretVault) -> None:
    created = await vault.create("OpenAI-Key", VALUE, {"team": "ml"})
    assert created.secret_id.startswith("sec_") and created.name == "openai-key"
    assert (created.version, created.metadata) == (1, {"team": "ml"})
    for key in (created.secret_id, "openai-key", "OPENAI-KEY"):
        assert (await vault.get(key)).secret_id == created.secret_id
    assert await vault.value("OpenAI-key") == VALUE
    # Names are unique whatever their case.
    with pytest.raises(Conflict, match="'openai-key' already exists"):
        await vault.create("OPENAI-KEY", "x", {})

    updated = await vault.update("openai-key", "v2", None)
    assert (updated.version, updated.metadata) == (2, {"team": "ml"})
    assert updated.created_at == created.created_at < updated.updated_at
    updated = await vault.update(created.secret_id, "v3", {})
    assert (updated.version, updated.metadata) == (3, {})
    assert await vault.value("openai-key") == "v3"

    await vault.delete("OpenAI-Key")
    assert await vault.value("openai-key") is None
    for call in (vault.get("openai-key"), vault.delete("openai-key"), vault.update("x", "v", None)):
        with pytest.raises(NotFound):
            await call


async def test_a_value_is_never_stored_in_clear(vault: SecretVault, tmp_path: Path) -> None:
    await vault.create("k", VALUE, {})
    await vault.update("k", VALUE + "-2", None)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("state.db*"))
    assert b"sk-live" not in stored


async def test_an_id_is_not_a_name_for_placeholders(vault: SecretVault) -> None:
    created = await vault.create("k", VALUE, {})
    assert await vault.value(created.secret_id) is None


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("", "must not be empty"),
        ("a}b", "'{', '}' and control characters"),
        ("a{b", "'{', '}' and control characters"),
        ("tab\there", "control characters"),
        ("c1\x85", "control characters"),
        ("Sec_abc", "prefix 'sec_' is reserved"),
        ("n" * (MAX_NAME_CHARS + 1), f"at most {MAX_NAME_CHARS} characters"),
    ],
)
async def test_bad_names_are_refused(vault: SecretVault, name: str, text: str) -> None:
    with pytest.raises(InvalidInput, match=text):
        await vault.create(name, VALUE, {})


@pytest.mark.parametrize(
    ("metadata", "text"),
    [
        ({str(i): "" for i in range(MAX_METADATA_ENTRIES + 1)}, "at most 32 entries, 33 given"),
        ({"k" * (MAX_METADATA_KEY_BYTES + 1): ""}, "1 to 128 bytes"),
        ({"": "v"}, "1 to 128 bytes"),
        ({"k": "é" * (MAX_METADATA_VALUE_BYTES // 2 + 1)}, "at most 1024 bytes"),
        ({f"k{i:02}": "v" * 1000 for i in range(9)}, f"at most {MAX_METADATA_BYTES} bytes in all"),
        ({"k": "a\x00"}, "NUL"),
        ({"k": "\ud800"}, "not valid UTF-8"),
    ],
)
async def test_metadata_over_e2b_bounds_is_refused(
    vault: SecretVault, metadata: dict[str, str], text: str
) -> None:
    with pytest.raises(InvalidInput, match=text):
        await vault.create("k", VALUE, metadata)
    await vault.create("k", VALUE, {})
    with pytest.raises(InvalidInput, match=text):
        await vault.update("k", VALUE, metadata)
    assert (await vault.get("k")).version == 1


async def test_metadata_at_the_bounds_is_taken(vault: SecretVault) -> None:
    # 32 entries of 128 + 128 bytes: 8192 in all.
    metadata = {f"{i:0128d}": "v" * 128 for i in range(MAX_METADATA_ENTRIES)}
    assert (await vault.create("k", VALUE, metadata)).metadata == metadata


@pytest.mark.parametrize("value", ["", "x" * (MAX_VALUE_BYTES + 1), "\udfff"])
async def test_bad_values_are_refused_without_being_quoted(vault: SecretVault, value: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        await vault.create("k", value, {})
    assert value not in refused.value.message or not value
