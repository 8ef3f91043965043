"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from ..live import TEST_KEY, LiveServer


@pytest.fixture
def e2b_env(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the unmodified E2B SDK at the live server with its three variables only."""
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
    monkeypatch.setenv("E2B_API_KEY", TEST_KEY)
