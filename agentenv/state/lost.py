"""Sandboxes lost with their node: what the control plane recorded when it declared the
node lost, so their users get a 404 that says so (not a bare "not found") and operators
can list them. Kept `KEPT_FOR` seconds."""

from __future__ import annotations

import builtins
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from .lifecycle import PUBLIC_STATE, State
from .schema import lost_sandboxes

KEPT_FOR = 7 * 24 * 3600.0


@dataclass(frozen=True)
class LostSandbox:
    sandbox_id: str
    node: str
    template_id: str
    state: str
    reason: str
    metadata: dict[str, str]
    lost_at: float

    @property
    def message(self) -> str:
        """What its users are told."""
        when = datetime.fromtimestamp(self.lost_at, UTC).isoformat(timespec="seconds")
        return (
            f"sandbox '{self.sandbox_id}' was lost with node '{self.node}' at {when}: {self.reason}"
        )


def loss_reason(state: State) -> str:
    """Why a sandbox in `state` could not outlive its node."""
    if PUBLIC_STATE[state] == "paused":
        return "it was paused, but its state had not reached the object store yet"
    return "it was running, and a running sandbox lives on its node only"


def lost_row(
    sandbox_id: str, node: str, template_id: str, state: State, metadata: dict[str, str]
) -> dict[str, object]:
    """The `lost_sandboxes` row for a sandbox lost now."""
    return {
        "sandbox_id": sandbox_id,
        "node": node,
        "template_id": template_id,
        "state": PUBLIC_STATE[state],
        "reason": loss_reason(state),
        "metadata": json.dumps(metadata),
        "lost_at": time.time(),
    }


class LostSandboxes:
    """The `lost_sandboxes` table of a state store (written by `SqlSandboxStore.forget`)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def get(self, sandbox_id: str) -> LostSandbox | None:
        query = sa.select(lost_sandboxes).where(lost_sandboxes.c.sandbox_id == sandbox_id)
        async with self.engine.connect() as connection:
            rows = list(await connection.execute(query))
        return _lost(rows[0]) if rows else None

    async def list(self) -> builtins.list[LostSandbox]:
        """Newest first."""
        query = sa.select(lost_sandboxes).order_by(lost_sandboxes.c.lost_at.desc())
        async with self.engine.connect() as connection:
            return [_lost(row) for row in await connection.execute(query)]

    async def prune(self) -> int:
        """Forget the losses older than `KEPT_FOR`; how many."""
        old = lost_sandboxes.c.lost_at < time.time() - KEPT_FOR
        async with self.engine.begin() as connection:
            return (await connection.execute(sa.delete(lost_sandboxes).where(old))).rowcount


def _lost(row: sa.Row[object]) -> LostSandbox:
    values = dict(row._mapping)
    values["metadata"] = json.loads(str(values["metadata"]))
    return LostSandbox(**values)
