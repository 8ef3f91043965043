"""The server key: sealing, former keys, and where the key comes from."""

from __future__ import annotations

import dataclasses

import pytest

from agentenv.config import Config, ConfigError
from agentenv.credentials.sealing import Sealer, SealError, derive_key, server_sealer

API_KEY = "e2b_" + "5" * 40
CONFIGURED = "k" * 32


def test_a_sealed_value_opens_only_in_its_own_row() -> None:
    sealer = Sealer(derive_key(CONFIGURED))
    sealed = sealer.seal(b"hunter2", "secret sec_1")
    assert b"hunter2" not in sealed.sealed and sealed.key_id == sealer.key_id
    assert sealer.open(sealed, "secret sec_1") == b"hunter2"
    # Each seal has its own nonce.
    assert sealer.seal(b"hunter2", "secret sec_1").sealed != sealed.sealed
    with pytest.raises(SealError, match="altered or misplaced"):
        sealer.open(sealed, "secret sec_2")
    altered = dataclasses.replace(
        sealed, sealed=sealed.sealed[:-1] + bytes([sealed.sealed[-1] ^ 1])
    )
    with pytest.raises(SealError):
        sealer.open(altered, "secret sec_1")


def test_former_keys_open_and_reseal_moves_to_the_current_one() -> None:
    old = Sealer(derive_key(API_KEY))
    sealed = old.seal(b"v", "ctx")
    new = Sealer(derive_key(CONFIGURED), (derive_key(API_KEY),))
    assert new.key_id != old.key_id
    assert new.open(sealed, "ctx") == b"v"
    moved = new.reseal(sealed, "ctx")
    assert moved is not None and moved.key_id == new.key_id and new.open(moved, "ctx") == b"v"
    assert new.reseal(moved, "ctx") is None
    with pytest.raises(SealError, match=f"sealed with key {new.key_id}"):
        old.open(moved, "ctx")


def test_the_key_comes_from_the_config_else_the_api_key() -> None:
    cfg = Config()
    derived = server_sealer(cfg, API_KEY)
    assert derived.key_id == Sealer(derive_key(API_KEY)).key_id
    # Every node of a cluster, sharing the API key, has the same key.
    assert server_sealer(Config(), API_KEY).key_id == derived.key_id
    cfg.server.secrets_key = CONFIGURED
    cfg.server.secrets_old_keys = f" {API_KEY} ,"
    configured = server_sealer(cfg, API_KEY)
    assert configured.key_id != derived.key_id
    assert configured.open(derived.seal(b"v", "c"), "c") == b"v"
    cfg.server.secrets_key = "short"
    with pytest.raises(ConfigError, match="at least 32 characters"):
        server_sealer(cfg, API_KEY)


def test_a_value_no_key_opens_is_left_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    lost = Sealer(derive_key(API_KEY)).seal(b"v", "secret sec_1")
    assert Sealer(derive_key(CONFIGURED)).reseal(lost, "secret sec_1") is None
    assert "secret sec_1: sealed with key" in caplog.text
