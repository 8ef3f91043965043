"""A real SQLite state store and the credentials over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agentenv.credentials.sealing import Sealer, derive_key
from agentenv.state.sandboxes import open_engine

SEALER = Sealer(derive_key("test server key " * 2))


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = await open_engine(f"sqlite:///{tmp_path / 'state.db'}")
    yield engine
    await engine.dispose()
