"""Volumes over a real state store (SQLite): names, tokens, and what a crash leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.errors import Conflict, InvalidInput, NotFound, Unauthorized
from agentenv.state.sandboxes import SqlSandboxStore
from agentenv.volumes.registry import VolumeRegistry
from agentenv.volumes.service import Volumes


async def _volumes(tmp_path: Path) -> tuple[Volumes, SqlSandboxStore]:
    store = await SqlSandboxStore.open(f"sqlite:///{tmp_path / 'state.db'}", "n1")
    return Volumes(VolumeRegistry(store.engine), tmp_path / "volumes", "node-1"), store


async def test_names_tokens_and_deletes(tmp_path: Path) -> None:
    volumes, store = await _volumes(tmp_path)
    try:
        made = await volumes.create("data")
        assert (await volumes.registry.get("data")).volume_id == made.volume_id
        with pytest.raises(Conflict):
            await volumes.create("data")
        with pytest.raises(InvalidInput):
            await volumes.create("no spaces")
        files = await volumes.open(made.volume_id, f"Bearer {made.token}")
        assert files.list_dir("/") == []
        for wrong in ("", f"Bearer {made.token}x", f"Basic {made.token}"):
            with pytest.raises(Unauthorized):
                await volumes.open(made.volume_id, wrong)
        await volumes.delete(made.volume_id)
        with pytest.raises(NotFound):
            await volumes.open(made.volume_id, f"Bearer {made.token}")
        assert not (tmp_path / "volumes" / made.volume_id).exists()
    finally:
        await store.close()


async def test_the_sweep_removes_what_a_crash_left(tmp_path: Path) -> None:
    volumes, store = await _volumes(tmp_path)
    try:
        kept, dropped = await volumes.create("kept"), await volumes.create("dropped")
        (tmp_path / "volumes" / kept.volume_id / "file").write_text("mine")
        # A delete that died after its record went, and an upload cut short.
        await volumes.registry.delete(dropped.volume_id)
        spools = tmp_path / "volumes" / ".spool"
        (spools / "node-1").mkdir(parents=True)
        (spools / "node-1" / "tmpupload").write_text("partial")
        # Another node's upload under way (a local cluster's nodes share the directory).
        (spools / "node-2").mkdir()
        (spools / "node-2" / "tmpupload").write_text("theirs")
        # And a create that died before its directory was made.
        orphan = await volumes.registry.create("no-directory")
        await volumes.sweep()
        left = sorted(p.name for p in (tmp_path / "volumes").iterdir())
        assert left == sorted([".spool", kept.volume_id, orphan.volume_id])
        assert list((spools / "node-1").iterdir()) == []
        assert (spools / "node-2" / "tmpupload").read_text() == "theirs"
        assert (tmp_path / "volumes" / kept.volume_id / "file").read_text() == "mine"
        # Only root reaches the volumes; each volume's own root is open to guests' users.
        assert (tmp_path / "volumes").stat().st_mode & 0o777 == 0o700
        assert (tmp_path / "volumes" / orphan.volume_id).stat().st_mode & 0o777 == 0o777
        files = await volumes.open(orphan.volume_id, f"Bearer {orphan.token}")
        assert files.list_dir("/") == []
    finally:
        await store.close()
