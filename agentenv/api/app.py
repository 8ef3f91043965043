"""The ASGI application: control-plane routes behind the sandbox proxy, with their lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request

from ..config import Config
from ..control.store import SqliteSandboxStore
from ..errors import Unavailable
from ..guest.kit import load_kit
from ..images.catalog import TemplateCatalog
from ..images.pull import ImagePuller
from ..images.registry import RegistryClient
from ..images.templates import TemplateRegistry
from ..net.netns import ensure_host_forwarding
from ..proxy.router import SandboxProxy
from ..runtime.bootsnap import BootSnapshots, Shape
from ..runtime.manager import SandboxManager, guest_kernel_args
from ..runtime.recovery import recover
from ..runtime.sweeper import run_sweeper
from ..storage.blockd import BlockdClient
from ..storage.stores import open_object_store
from ..vmm.accel import choose_accel
from ..vmm.qemu import QemuDriver, run_dir_for
from . import builds, sandboxes, templates
from .auth import ApiKeyAuth, load_or_create_api_key
from .errors import install_error_handlers
from .models import Health

log = logging.getLogger(__name__)


def build_api(cfg: Config, api_key: str) -> FastAPI:
    """The FastAPI app; its lifespan starts the node runtime and stops its background work."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        kit = load_kit(cfg)
        if kit is None:
            raise Unavailable("the guest kit is not built: run `aenv kit build` (or `make run`)")
        accel = await asyncio.to_thread(
            choose_accel,
            cfg.vmm.accel,
            cfg.vmm.qemu_binary,
            kit.kernel,
            cfg.kit_dir,
            cfg.vmm.kvm_probe_timeout,
        )
        log.info("accelerator: %s (%s)", accel.name, accel.reason)
        objects = open_object_store(cfg)
        template_registry = TemplateRegistry(objects)
        blockd = BlockdClient(cfg)
        await asyncio.to_thread(blockd.ensure_running)
        catalog = TemplateCatalog(cfg, template_registry, blockd)
        registry = RegistryClient(
            docker_config=Path(cfg.registry.auth_file) if cfg.registry.auth_file else None,
            insecure_registries=cfg.registry.insecure_hosts(),
            mirrors=cfg.registry.mirror_map(),
            platform=cfg.registry.platform,
        )
        app.state.catalog = catalog
        app.state.puller = ImagePuller(
            objects,
            registry,
            template_registry,
            cfg.home / "pull",
            cfg.sandbox.disk_size_mb * 2**20,
        )
        store = SqliteSandboxStore(cfg.state_db)
        driver = QemuDriver(cfg.vmm.qemu_binary, accel.name, run_dir_for(cfg.home))
        snapshots = None
        if cfg.sandbox.boot_snapshots:
            snapshots = BootSnapshots(
                cfg.kit_dir / "boot-snapshots",
                kit,
                driver,
                guest_kernel_args(cfg),
                accel.name,
                cfg.sandbox.boot_timeout,
            )
            snapshots.request(Shape(cfg.sandbox.vcpus, cfg.sandbox.memory_mb))
        manager = SandboxManager(cfg, store, driver, kit, catalog, snapshots)
        await ensure_host_forwarding(cfg.net.host_subnet, cfg.net.name_prefix)
        await recover(manager)
        app.state.manager = manager
        app.state.accelerator = accel
        sweeper = asyncio.create_task(run_sweeper(manager))
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            if snapshots is not None:
                await snapshots.close()
            await store.close()
            registry.close()

    app = FastAPI(title="AgentENV", version="0.1.0", lifespan=lifespan)
    app.state.config = cfg
    install_error_handlers(app)

    @app.get("/health", tags=["node"])
    async def health(request: Request) -> Health:
        manager: SandboxManager = request.app.state.manager
        return Health(
            status="ok",
            sandboxes=len(await manager.list()),
            accelerator=request.app.state.accelerator.name,
        )

    protected = APIRouter(dependencies=[Depends(ApiKeyAuth(api_key))])
    protected.include_router(sandboxes.router)
    protected.include_router(templates.router)
    protected.include_router(builds.router)
    app.include_router(protected)
    return app


def create_app(cfg: Config) -> Any:
    """API plus data-plane proxy; prints a newly generated API key once."""
    api_key, created = load_or_create_api_key(cfg.server.api_key, cfg.home)
    if created:
        print(f"Generated API key (stored under {cfg.home}/secrets): {api_key}", flush=True)
    api = build_api(cfg, api_key)

    def resolve(sandbox_id: str):
        manager: SandboxManager | None = getattr(api.state, "manager", None)
        return manager.route(sandbox_id) if manager else None

    return SandboxProxy(api, resolve, cfg.server.domain)
