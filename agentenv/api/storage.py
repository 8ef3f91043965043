"""Object store maintenance (native): collect layers and chunks nothing uses any more."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from .deps import ConfigDep, NodeDep
from .errors import ERROR_RESPONSES

router = APIRouter(responses=ERROR_RESPONSES)


class CollectBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Default: `storage.gc_grace`. Objects younger than this are kept.
    graceSeconds: float | None = Field(default=None, ge=0, le=10_000_000)


# Seconds a request waits for writers' leases (uploads under way) before the collection
# is skipped, said in the answer: an operator's call answers promptly and may be retried.
REQUEST_LEASE_WAIT = 5.0


@router.post("/gc")
async def collect_garbage(
    node: NodeDep, cfg: ConfigDep, body: CollectBody | None = None
) -> dict[str, Any]:
    """Delete unreferenced layers and chunks older than the grace period; what it did."""
    grace = cfg.storage.gc_grace if body is None or body.graceSeconds is None else body.graceSeconds
    report = await node.collector.run(grace, wait=REQUEST_LEASE_WAIT)
    return dataclasses.asdict(report)
