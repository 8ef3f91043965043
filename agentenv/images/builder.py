"""Running template builds in the background: a pull of an image, a copy of a template, or
steps run in a build sandbox (`stepbuild.py`).

The API registers and validates a build; this service does the work and records its
outcome on the `Build`, which clients poll.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from ..config import Config
from ..errors import AenvError, InvalidInput, PermanentlyUnavailable
from .buildfiles import BuildFiles
from .builds import Build, BuildTracker
from .catalog import TemplateCatalog
from .pull import ImagePuller, default_name
from .reference import parse_reference
from .registry import RegistryClient
from .stepbuild import BuildHost, Recipe, StepBuild, StepFailed
from .templates import TemplateRecord

log = logging.getLogger(__name__)


class TemplateBuilds:
    """Builds by id, and the tasks running them (held, so they are never collected)."""

    def __init__(
        self,
        cfg: Config,
        catalog: TemplateCatalog,
        puller: ImagePuller,
        max_vcpus: int,
        files: BuildFiles,
    ) -> None:
        self.cfg = cfg
        self.catalog = catalog
        self.puller = puller
        self.max_vcpus = max_vcpus
        self.files = files
        self.tracker = BuildTracker()
        # Set by the node once its sandboxes can be made (builds from steps need them).
        self.host: BuildHost | None = None
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

    def from_steps(
        self,
        build: Build,
        recipe: Recipe,
        image: str | None,
        credentials: tuple[str, str] | None,
    ) -> asyncio.Task[None]:
        """Run `recipe` in a build sandbox; `image`, when given, is pulled to be its parent.
        The task ends with the build (its outcome is on `build`)."""
        return self._start(build, self._steps(build, recipe, image, credentials))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start(self, build: Build, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        build.start()
        task = asyncio.create_task(_run(build, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _pull(self, build: Build, image: str, credentials: tuple[str, str] | None) -> None:
        record = await self._pulled(build, image, build.template_id, credentials)
        sized = _sized(build, record)
        if sized != record:  # the puller saved the record already; only a size changes it
            await asyncio.to_thread(self.catalog.templates.save, sized)
        await self._retire(build.template_id)
        build.succeed(f"template {record.template_id} ready: {record.source} ({record.digest})")

    async def _pulled(
        self, build: Build, image: str, name: str, credentials: tuple[str, str] | None
    ) -> TemplateRecord:
        progress = build.progress()
        if credentials is None:
            return await asyncio.to_thread(self.puller.pull, image, name, progress)
        return await asyncio.to_thread(self._pull_with, image, name, credentials, progress)

    async def _retire(self, name: str) -> None:
        """A template from an image or a copy replaces one built from steps."""
        if self.host is not None:
            await self.host.retire(name)

    async def _steps(
        self,
        build: Build,
        recipe: Recipe,
        image: str | None,
        credentials: tuple[str, str] | None,
    ) -> None:
        if self.host is None:
            raise PermanentlyUnavailable("template builds from steps need this server's sandboxes")
        if image is not None:
            # The image is a template of its own (as `aenv pull` names it), the parent.
            name = default_name(parse_reference(image))
            if name == build.template_id:
                raise InvalidInput(f"the template cannot have its image's name '{name}'")
            recipe.parent = (await self._pulled(build, image, name, credentials)).template_id
        templates = self.catalog.templates
        if await asyncio.to_thread(templates.find, build.template_id) is not None:
            # A template made from an image alone before: this build replaces it.
            await asyncio.to_thread(templates.delete, build.template_id)
        snapshot_id = await StepBuild(self.host, build, recipe, self.files.get).run()
        await self.host.tag(snapshot_id, build.tags)
        build.succeed(f"template {build.template_id} ready: build {snapshot_id}")

    def _pull_with(
        self,
        image: str,
        name: str,
        credentials: tuple[str, str],
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
            return own.pull(image, name, progress)
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
        await self._retire(build.template_id)
        build.succeed(f"template {build.template_id} ready: a copy of {parent}")


async def _run(build: Build, work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except StepFailed as exc:
        build.fail(exc.message, exc.step)
    except AenvError as exc:
        build.fail(exc.message)
    except Exception as exc:
        # A bug or a part failing: its traceback in the server's log, its name at least
        # in the build's reason (some exceptions have no message).
        log.exception("build %s of %s failed", build.build_id, build.template_id)
        build.fail(f"build failed: {str(exc) or type(exc).__name__}")


def _sized(build: Build, record: TemplateRecord) -> TemplateRecord:
    """`record` with the sandbox size the build asked for (else the one it has)."""
    return dataclasses.replace(
        record,
        vcpus=build.vcpus or record.vcpus,
        memory_mb=build.memory_mb or record.memory_mb,
    )
