"""Running template builds: a pull of an image or a copy of a template, in the background.

The API registers and validates a build; this service does the work and records its
outcome on the `Build`, which clients poll.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from ..config import Config
from ..errors import AenvError, InvalidInput
from .builds import Build, BuildTracker
from .catalog import TemplateCatalog
from .pull import ImagePuller
from .reference import parse_reference
from .registry import RegistryClient
from .templates import TemplateRecord


class TemplateBuilds:
    """Builds by id, and the tasks running them (held, so they are never collected)."""

    def __init__(
        self, cfg: Config, catalog: TemplateCatalog, puller: ImagePuller, max_vcpus: int
    ) -> None:
        self.cfg = cfg
        self.catalog = catalog
        self.puller = puller
        self.max_vcpus = max_vcpus
        self.tracker = BuildTracker()
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, template_id: str, vcpus: int | None, memory_mb: int | None) -> Build:
        """A new build waiting for its recipe; a size this node can never run is refused."""
        if vcpus is not None and vcpus > self.max_vcpus:
            raise InvalidInput(f"cpuCount: at most {self.max_vcpus} vCPUs here, {vcpus} asked")
        build = self.tracker.create(template_id)
        build.vcpus, build.memory_mb = vcpus, memory_mb
        return build

    def from_image(self, build: Build, image: str, credentials: tuple[str, str] | None) -> None:
        self._start(build, self._pull(build, image, credentials))

    def from_template(self, build: Build, parent: str) -> None:
        self._start(build, self._copy(build, parent))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start(self, build: Build, work: Coroutine[Any, Any, None]) -> None:
        build.start()
        task = asyncio.create_task(_run(build, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pull(self, build: Build, image: str, credentials: tuple[str, str] | None) -> None:
        progress = build.progress()
        if credentials is None:
            record = await asyncio.to_thread(self.puller.pull, image, build.template_id, progress)
        else:
            record = await asyncio.to_thread(self._pull_with, image, credentials, build, progress)
        sized = _sized(build, record)
        if sized != record:  # the puller saved the record already; only a size changes it
            await asyncio.to_thread(self.catalog.templates.save, sized)
        build.succeed(f"template {record.template_id} ready: {record.source} ({record.digest})")

    def _pull_with(
        self,
        image: str,
        credentials: tuple[str, str],
        build: Build,
        progress: Callable[[str], None],
    ) -> TemplateRecord:
        """Pull through a client of this build's own, so its credentials reach no other pull."""
        ref = parse_reference(image)
        registry = RegistryClient(
            credentials={ref.registry: credentials},
            insecure_registries=self.cfg.registry.insecure_hosts(),
            mirrors=self.cfg.registry.mirror_map(),
            platform=self.cfg.registry.platform,
        )
        # Same store, templates and per-image locks; only the registry client differs.
        own = copy.copy(self.puller)
        own.registry = registry
        try:
            return own.pull(image, build.template_id, progress)
        finally:
            registry.close()

    async def _copy(self, build: Build, parent: str) -> None:
        templates = self.catalog.templates
        record = await asyncio.to_thread(templates.get, parent)
        build.log(f"from template {parent}: {record.source} ({record.digest})")
        copied = dataclasses.replace(
            record, template_id=build.template_id, created_at=datetime.now(UTC).isoformat()
        )
        await asyncio.to_thread(templates.save, _sized(build, copied))
        build.succeed(f"template {build.template_id} ready: a copy of {parent}")


async def _run(build: Build, work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except AenvError as exc:
        build.fail(exc.message)
    except Exception as exc:
        build.fail(f"build failed: {exc}")


def _sized(build: Build, record: TemplateRecord) -> TemplateRecord:
    """`record` with the sandbox size the build asked for (else the one it has)."""
    return dataclasses.replace(
        record,
        vcpus=build.vcpus or record.vcpus,
        memory_mb=build.memory_mb or record.memory_mb,
    )
