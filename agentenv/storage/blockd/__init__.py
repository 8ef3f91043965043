"""The block daemon: serves image layer stacks as read-only raw files over FUSE.

`BlockdClient` (used by the server) starts and talks to the daemon; `run_daemon` is the
daemon itself (`python -m agentenv.storage.blockd --home <dir>`).
"""

from __future__ import annotations

from .client import BlockdClient, BlockdError
from .common import BlockdPaths

__all__ = ["BlockdClient", "BlockdError", "BlockdPaths"]
