"""Named persistent volumes: records in the state store, files on the node serving them."""

from __future__ import annotations

import asyncio
import hmac
import shutil
from pathlib import Path

from ..errors import Unauthorized
from .content import VolumeFiles
from .registry import VolumeRecord, VolumeRegistry

VOLUME_ROOT_MODE = 0o777


# Upload spools, one per node, under the volumes directory.
SPOOLS = ".spool"


class Volumes:
    """Create, find and delete volumes; open one's files for its token's holder."""

    def __init__(self, registry: VolumeRegistry, root: Path, node: str) -> None:
        """`node` names this node's own spool: nodes of a local cluster share `root`, and
        each one's start-up sweep must leave the others' uploads alone."""
        self.registry = registry
        self._root = root
        self._spools = root / SPOOLS
        self._spool = self._spools / node

    async def sweep(self) -> None:
        """At start: uploads a crash cut short, and the files of volumes whose record is
        gone (a delete that died between the two), are removed; a volume whose directory
        is missing (a create that died between the two) gets it."""
        known = {record.volume_id for record in await self.registry.list()}
        await asyncio.to_thread(self._sweep, known)

    def _sweep(self, known: set[str]) -> None:
        # The node's alone: guests' files in there may be setuid or devices, and no host
        # user but root may reach them.
        self._root.mkdir(parents=True, exist_ok=True)
        self._root.chmod(0o700)
        shutil.rmtree(self._spool, ignore_errors=True)
        self._spool.mkdir(parents=True)
        for entry in self._root.iterdir():
            if entry.name not in known and entry != self._spools:
                shutil.rmtree(entry, ignore_errors=True)
        for volume_id in known:
            if not (self._root / volume_id).exists():
                self._make_directory(self._root / volume_id)

    async def create(self, name: str) -> VolumeRecord:
        record = await self.registry.create(name)
        await asyncio.to_thread(self._make_directory, self.directory(record))
        return record

    @staticmethod
    def _make_directory(directory: Path) -> None:
        # Open to every user of a guest that mounts it, as a fresh disk's root is to root:
        # the SDKs' default user writes there.
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(VOLUME_ROOT_MODE)

    async def delete(self, volume_id: str) -> None:
        """The record first: a volume half deleted is gone for clients, its files after."""
        record = await self.registry.delete(volume_id)
        await asyncio.to_thread(self.files(record).destroy)

    def directory(self, record: VolumeRecord) -> Path:
        return self._root / record.volume_id

    def files(self, record: VolumeRecord) -> VolumeFiles:
        return VolumeFiles(self.directory(record), self._spool)

    async def open(self, volume_id: str, authorization: str) -> VolumeFiles:
        """The volume's files, for a request whose `Authorization: Bearer` is its token."""
        record = await self.registry.get(volume_id)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), record.token.encode()
        ):
            raise Unauthorized("missing or invalid volume token")
        return self.files(record)
