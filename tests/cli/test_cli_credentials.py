"""Credentials file and environment precedence."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from agentenv.cli.context import Context
from agentenv.cli.credentials import (
    DEFAULT_URL,
    Credentials,
    credentials_path,
    load_credentials,
    save_credentials,
)
from agentenv.cli.main import main


def test_defaults_without_file_or_env() -> None:
    assert load_credentials({}) == Credentials(DEFAULT_URL, "")


def test_file_then_env_wins() -> None:
    save_credentials(Credentials("http://file:1", "file-key"))
    assert load_credentials({}) == Credentials("http://file:1", "file-key")
    env = {"AENV_API_URL": "http://env:2/", "AENV_API_KEY": "env-key"}
    assert load_credentials(env) == Credentials("http://env:2", "env-key")
    assert load_credentials({"AENV_API_KEY": "env-key"}) == Credentials("http://file:1", "env-key")


def test_file_and_dir_modes(_isolated_home: Path) -> None:
    path = save_credentials(Credentials("http://x", "k"))
    assert path == _isolated_home / ".config" / "aenv" / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)
    save_credentials(Credentials("http://y", "k2"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": "http://y", "key": "k2"}


def test_unreadable_file_is_reported() -> None:
    path = credentials_path()
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_credentials({})


def test_auth_command_non_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO())
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(env={}, stdout=out, stderr=err)
    assert main(["auth", "--url", "http://h:9/", "--key", "secret"], ctx) == 0
    assert load_credentials({}) == Credentials("http://h:9", "secret")
    # Only the URL changes; the stored key is kept.
    assert main(["auth", "--url", "http://h:10"], ctx) == 0
    assert load_credentials({}) == Credentials("http://h:10", "secret")


def test_auth_without_any_key_is_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO())
    err = io.StringIO()
    assert (
        main(["auth", "--url", "http://h"], Context(env={}, stdout=io.StringIO(), stderr=err)) == 2
    )
    assert "no API key" in err.getvalue()
    assert not credentials_path().exists()
