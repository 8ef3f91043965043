"""The guest agent of a hollow node's sandboxes (tests, benchmarks): it answers the host's
own calls at once and runs nothing, since no guest is there."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import Unavailable
from .client import CONNECT_TIMEOUT, AgentClient

_NOTHING_RUNS = "a hollow node's sandbox has no guest to run anything"


class HollowAgent(AgentClient):
    """Healthy, initialised and idle; a process or a file is refused."""

    async def healthy(self, answer_within: float = CONNECT_TIMEOUT) -> bool:
        return True

    async def init(self, env_vars: dict[str, str], access_token: str | None, **_: Any) -> None:
        return None

    async def reclaim(self) -> int:
        return 0

    async def sync(self) -> None:
        return None

    async def metrics(self) -> dict[str, Any]:
        return {
            "ts": int(time.time()), "cpu_count": 1, "cpu_used_pct": 0.0, "mem_total": 0,
            "mem_used": 0, "mem_cache": 0, "disk_used": 0, "disk_total": 0,
            "idle_seconds": 0.0, "reclaims": 0,
        }  # fmt: skip

    async def logs(self, start_ms: int) -> list[dict[str, Any]]:
        return []

    async def write_file(self, path: str, data: bytes, user: str = "root") -> None:
        raise Unavailable(_NOTHING_RUNS)

    async def start_detached(
        self, argv: list[str], tag: str, *, user: str | None = None, cwd: str | None = None
    ) -> int:
        raise Unavailable(_NOTHING_RUNS)

    async def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> int:
        raise Unavailable(_NOTHING_RUNS)
