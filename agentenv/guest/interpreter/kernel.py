"""One Jupyter kernel: start, execute a cell and stream its iopub messages, interrupt,
restart, shut down (jupyter_client's AsyncKernelManager and AsyncKernelClient)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from .languages import Language

log = logging.getLogger("aenv_interpreter")

Message = dict[str, Any]
TICK = 1.0


class KernelDied(RuntimeError):
    """The kernel went away while a cell ran (restarted, crashed or shut down)."""


class CellFailed(RuntimeError):
    """A cell the service runs for itself (set-up, environment) raised."""


class Kernel:
    """A running kernel; cells are routed to their caller by the request's msg_id."""

    def __init__(self, language: Language, cwd: str, startup_code: str = "") -> None:
        self.spec = language.kernel
        self.cwd = cwd
        self.startup_code = startup_code
        self._manager = AsyncKernelManager(kernel_name=self.spec)
        # Deno's kernel publishes a cell's output after the cell's status idle: such a cell
        # ends only once a kernel_info request sent at its idle has been answered on iopub.
        self.output_trails_idle = language.output_trails_idle
        self.interrupt_by_message = language.interrupt_by_message
        self.start_timeout = language.start_timeout
        self._client: AsyncKernelClient | None = None
        self._cells: dict[str, asyncio.Queue[Message | None]] = {}
        self._readers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        spec = self._manager.kernel_spec  # raises NoSuchKernel when not installed
        if spec is not None and self.interrupt_by_message:
            spec.interrupt_mode = "message"
        await self._manager.start_kernel(cwd=self.cwd)
        await self._connect()

    async def restart(self) -> None:
        await self._disconnect()
        await self._manager.restart_kernel(now=True)
        await self._connect()

    async def shutdown(self) -> None:
        await self._disconnect()
        with contextlib.suppress(Exception):
            await self._manager.shutdown_kernel(now=True)

    async def interrupt(self) -> None:
        await self._manager.interrupt_kernel()

    async def execute(self, code: str, silent: bool = False) -> AsyncIterator[Message | None]:
        """The iopub messages of one cell, up to its status idle; None after each second
        without one (the caller may write a keepalive). Raises KernelDied if the kernel goes."""
        client = self._require_client()
        # No await between sending and registering: the readers run on this loop.
        msg_id = client.execute(
            code, silent=silent, store_history=not silent, allow_stdin=False, stop_on_error=False
        )
        queue: asyncio.Queue[Message | None] = asyncio.Queue()
        self._cells[msg_id] = queue
        marker = ""
        try:
            while True:
                try:
                    msg = await asyncio.wait_for(queue.get(), TICK)
                except TimeoutError:
                    if not await self._manager.is_alive():
                        raise KernelDied(
                            f"the {self.spec} kernel died while the cell ran"
                        ) from None
                    yield None
                    continue
                if msg is None:
                    raise KernelDied(f"the {self.spec} kernel stopped while the cell ran")
                idle = msg["content"].get("execution_state") == "idle"
                parent = msg["parent_header"].get("msg_id")
                if msg["msg_type"] != "status":
                    if parent == msg_id:
                        yield msg
                elif idle and (parent == marker or not self.output_trails_idle):
                    return
                elif idle and parent == msg_id:
                    marker = client.kernel_info()
                    self._cells[marker] = queue
        finally:
            del self._cells[msg_id]
            self._cells.pop(marker, None)

    async def run_quietly(self, code: str) -> None:
        """Run a cell of the service's own; raise CellFailed if it raised."""
        if not code.strip():
            return
        async for msg in self.execute(code, silent=True):
            if msg is not None and msg["msg_type"] == "error":
                content = msg["content"]
                raise CellFailed(f"{content.get('ename')}: {content.get('evalue')}")

    async def _connect(self) -> None:
        client = self._manager.client()
        client.start_channels()
        # Returns once a kernel_info reply came and iopub delivered a message: iopub is
        # subscribed, so the first cell's output is not lost (Deno's kernel would lose it).
        await client.wait_for_ready(timeout=self.start_timeout)
        self._client = client
        self._readers = [
            asyncio.create_task(self._read(client, "iopub")),
            asyncio.create_task(self._read(client, "shell")),
        ]
        await self.run_quietly(self.startup_code)

    async def _disconnect(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._readers = []
        for queue in self._cells.values():
            queue.put_nowait(None)
        if self._client is not None:
            self._client.stop_channels()
            self._client = None

    async def _read(self, client: AsyncKernelClient, channel: str) -> None:
        """Route iopub messages to their cell; drain shell replies (the cells end on idle)."""
        source = client.iopub_channel if channel == "iopub" else client.shell_channel
        while True:
            try:
                msg = await source.get_msg()
            except Exception:
                log.exception("reading the %s kernel's %s channel", self.spec, channel)
                await asyncio.sleep(0.1)
                continue
            if channel == "shell":
                continue
            if (
                msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "restarting"
            ):
                for queue in self._cells.values():
                    queue.put_nowait(None)
                continue
            cell = self._cells.get(msg["parent_header"].get("msg_id", ""))
            if cell is not None:
                cell.put_nowait(msg)

    def _require_client(self) -> AsyncKernelClient:
        if self._client is None:
            raise KernelDied(f"the {self.spec} kernel is not running")
        return self._client
