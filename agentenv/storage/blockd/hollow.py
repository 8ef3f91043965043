"""A hollow node's block daemon (tests, benchmarks): it serves each layer stack as an
empty file and starts no process, since no guest reads a disk there."""

from __future__ import annotations

from typing import Any

from .client import BlockdClient


class HollowBlockd(BlockdClient):
    """Answers the daemon's requests in memory: mounts, status and counters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Stacks served, by name: the collector keeps their layers.
        self._served: dict[str, list[str]] = {}

    def request(self, req: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        op, name = req.get("op"), str(req.get("name", ""))
        images = self.paths.root / "hollow"
        if op == "mount":
            images.mkdir(parents=True, exist_ok=True)
            path = images / f"{name}.img"
            path.touch()
            self._served[name] = list(req.get("layers") or [])
            return {"path": str(path), "size": 0}
        if op == "unmount":
            return {"existed": self._served.pop(name, None) is not None}
        if op == "prefetch":
            return {"chunks": 0}
        if op == "stats":
            return {"cache": {}}
        mounts = [{"name": n, "layers": layers} for n, layers in sorted(self._served.items())]
        return {"pid": 0, "mounts": mounts}

    def ensure_running(self) -> int:
        return 0

    def stop(self, timeout: float = 20.0) -> None:
        return None
