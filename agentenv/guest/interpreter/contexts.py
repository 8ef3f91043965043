"""Contexts: a kernel each, with its language and working directory; one default context
per language. Cells in one context run one at a time, contexts run side by side."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

from . import kernel_startup, outputs
from .kernel import CellFailed, Kernel, KernelDied
from .languages import PYTHON, Language, language
from .outputs import Output
from .sandbox_env import sandbox_envs

log = logging.getLogger("aenv_interpreter")


class ContextStartFailed(RuntimeError):
    """The context's kernel did not start (not installed, bad cwd, crashed)."""


class Context:
    def __init__(self, lang: Language, cwd: str) -> None:
        self.id = str(uuid.uuid4())
        self.language = lang
        self.cwd = cwd
        startup = kernel_startup.code() if lang is PYTHON else ""
        self.kernel = Kernel(lang, cwd, startup)
        self.lock = asyncio.Lock()
        # The sandbox's variables once set in this kernel; None until the first cell.
        self.sandbox_env: dict[str, str] | None = None
        self.restarting = False

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language.name, "cwd": self.cwd}

    async def start(self) -> None:
        try:
            await self.kernel.start()
        except Exception as err:
            await self.kernel.shutdown()
            raise ContextStartFailed(
                f"cannot start a {self.language.name} kernel ({self.language.kernel}): {err}"
            ) from err

    async def restart(self) -> None:
        self.restarting = True
        try:
            await self.kernel.restart()
        finally:
            self.restarting = False
            self.sandbox_env = None

    def execute(self, code: str, env_vars: dict[str, str], access_token: str | None) -> Execution:
        return Execution(self, code, env_vars, access_token)


class Execution:
    """One cell run in a task of its own, so a client that goes away only interrupts it:
    the task still waits for the kernel, restores the environment and frees the context."""

    def __init__(
        self, context: Context, code: str, env_vars: dict[str, str], access_token: str | None
    ) -> None:
        self.context = context
        # None: a second without output (a keepalive's moment); the stream ends with END.
        self.outputs: asyncio.Queue[Output | None] = asyncio.Queue()
        self.abandoned = False
        # Holding the context's lock: only then may a client that leaves interrupt the kernel
        # (before, the kernel runs someone else's cell).
        self.running = False
        self.task = asyncio.create_task(self._run(code, env_vars, access_token))
        _RUNNING.add(self.task)
        self.task.add_done_callback(_RUNNING.discard)

    async def stream(self) -> AsyncIterator[Output | None]:
        while (output := await self.outputs.get()) is not outputs.END_OF_EXECUTION:
            yield output
        yield output

    async def abandon(self) -> None:
        """The client left: stop the cell (a timeout in the SDK ends here)."""
        self.abandoned = True
        if self.running:
            log.info("client left context %s mid-cell: interrupting", self.context.id)
            with contextlib.suppress(Exception):
                await self.context.kernel.interrupt()

    async def _run(self, code: str, env_vars: dict[str, str], access_token: str | None) -> None:
        context = self.context
        try:
            async with context.lock:
                if self.abandoned:
                    return
                self.running = True
                try:
                    await self._cell(code, env_vars, access_token)
                finally:
                    self.running = False
        except Exception:
            log.exception("execution in context %s failed", context.id)
            self.outputs.put_nowait(outputs.error("InternalError", "see the service's log", ""))
        finally:
            self.outputs.put_nowait(outputs.END_OF_EXECUTION)

    async def _cell(self, code: str, env_vars: dict[str, str], access_token: str | None) -> None:
        context, kernel, lang = self.context, self.context.kernel, self.context.language
        try:
            if context.sandbox_env is None:
                envs = await sandbox_envs(access_token)
                if envs is not None:
                    await kernel.run_quietly(lang.set_env(envs))
                    context.sandbox_env = envs
            await kernel.run_quietly(lang.set_env(env_vars))
        except CellFailed as err:
            self.outputs.put_nowait(outputs.error("EnvironmentError", str(err), ""))
            return
        except KernelDied as err:
            await self._died(err)
            return
        try:
            async for msg in kernel.execute(code):
                if msg is None:
                    self.outputs.put_nowait(None)
                elif (output := outputs.from_iopub(msg)) is not None:
                    self.outputs.put_nowait(output)
        except KernelDied as err:
            await self._died(err)
            return
        with contextlib.suppress(CellFailed, KernelDied):
            await kernel.run_quietly(
                lang.unset_env(list(env_vars)) + "\n" + self._restore(env_vars)
            )

    def _restore(self, env_vars: dict[str, str]) -> str:
        """Code giving each variable back the value it had: the sandbox's, or the one the
        kernel was started with."""
        before: dict[str, str] = {}
        for key in env_vars:
            value = (self.context.sandbox_env or {}).get(key, os.environ.get(key))
            if value is not None:
                before[key] = value
        return self.context.language.set_env(before)

    async def _died(self, err: KernelDied) -> None:
        context = self.context
        if context.restarting:
            self.outputs.put_nowait(outputs.error("ContextRestarting", "Context was restarted", ""))
            return
        self.outputs.put_nowait(outputs.error("KernelDied", str(err), ""))
        log.warning("context %s: %s; restarting its kernel", context.id, err)
        try:
            await context.restart()
        except Exception:
            log.exception("restarting the kernel of context %s", context.id)


_RUNNING: set[asyncio.Task[None]] = set()


class Contexts:
    """Every context by id, and the default one of each language."""

    def __init__(self, default_cwd: str) -> None:
        self.default_cwd = default_cwd
        self._by_id: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}
        self._default_lock = asyncio.Lock()

    async def create(self, lang_name: str | None, cwd: str | None) -> Context:
        context = Context(language(lang_name), cwd or self.default_cwd)
        await context.start()
        self._by_id[context.id] = context
        log.info("context %s: %s in %s", context.id, context.language.name, context.cwd)
        return context

    async def default(self, lang_name: str | None) -> Context:
        lang = language(lang_name)
        async with self._default_lock:
            found = self._by_id.get(self._defaults.get(lang.name, ""))
            if found is None:
                found = await self.create(lang.name, None)
                self._defaults[lang.name] = found.id
            return found

    def get(self, context_id: str) -> Context | None:
        return self._by_id.get(context_id)

    def list(self) -> list[dict[str, Any]]:
        return [context.describe() for context in self._by_id.values()]

    async def remove(self, context_id: str) -> bool:
        context = self._by_id.pop(context_id, None)
        if context is None:
            return False
        await context.kernel.shutdown()
        return True

    async def close(self) -> None:
        for context_id in list(self._by_id):
            await self.remove(context_id)
