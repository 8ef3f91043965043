"""One machine's runtime: kit, accelerator, stores, block daemon, VMM driver, sandboxes.

`Node.open` brings the parts up in dependency order and `close` takes them down in
reverse; the API only receives the services it serves (`manager`, `catalog`, `builds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from ipaddress import IPv4Address
from pathlib import Path

from ...config import Config
from ...credentials.identity import IdentitySettings
from ...credentials.placeholders import Credentials
from ...credentials.sealing import Sealer
from ...errors import NotFound, PermanentlyUnavailable
from ...guest.kit import load_kit
from ...images.builder import TemplateBuilds
from ...images.buildfiles import BuildFiles
from ...images.catalog import TemplateCatalog, base_in_store
from ...images.pull import ImagePuller
from ...images.reference import full_reference
from ...images.registry import RegistryClient
from ...images.snapshots import SnapshotRegistry
from ...images.templates import TemplateRegistry
from ...net.authority import EgressAuthority
from ...net.egressproxy import EgressProxy, upstream_context
from ...net.netns import ensure_host_forwarding
from ...net.subnetclaim import claimed_subnet
from ...net.tunnels import EgressTunnels
from ...observe.metrics import CACHE, CAPACITY_MB, DISK_MB, SANDBOXES, set_counts
from ...state.lifecycle import State
from ...state.nodes import NodeCapacity, NodeRegistry
from ...state.sandboxes import SandboxRecord, SqlSandboxStore
from ...storage.blockd import BlockdClient
from ...storage.blockd.hollow import HollowBlockd
from ...storage.stores import open_object_store
from ...vmm.accel import AccelChoice, choose_accel
from ...vmm.hollow import HollowDriver
from ...vmm.qemu import QemuDriver, run_dir_for
from ...volumes.nfs import NfsServer
from ...volumes.registry import VolumeRegistry
from ...volumes.service import Volumes
from ..machine.bootsnap import BootSnapshots, Shape
from ..machine.host import MachineHost
from ..machine.mounts import VolumeExports
from ..memory.admission import committed_by
from ..sandboxes.creation import CreateRequest, SandboxCreations
from ..sandboxes.machines import guest_kernel_args
from ..sandboxes.manager import SandboxManager
from ..sandboxes.warmpool import WarmPool
from ..snapshots.fork import SandboxForks
from ..snapshots.named import SandboxSnapshots
from ..snapshots.pause import SandboxPauses
from ..snapshots.persist import Uploads
from ..snapshots.servedram import ServedRam
from .buildhost import NodeBuildHost
from .collect import Collector
from .heartbeat import NodePresence, node_capacity
from .interpreter import TEMPLATE as CODE_INTERPRETER
from .interpreter import CodeInterpreterTemplate
from .memorykeeper import MemoryKeeper
from .recovery import recover
from .sweeper import run_sweeper

log = logging.getLogger(__name__)

# Seconds between sweeps for served RAM nothing links to any more.
_RAM_SWEEP_INTERVAL = 30.0


class Node:
    """Made by `Node.open`, ended by `close`; the VMs and the block daemon outlive it."""

    def __init__(
        self,
        cfg: Config,
        accelerator: AccelChoice,
        manager: SandboxManager,
        snapshots: SandboxSnapshots,
        collector: Collector,
        catalog: TemplateCatalog,
        puller: ImagePuller,
        builds: TemplateBuilds,
        stack: contextlib.AsyncExitStack,
        nodes: NodeRegistry,
        volumes: Volumes,
        credentials: Credentials,
        warm_pool: WarmPool | None = None,
    ) -> None:
        self.cfg = cfg
        self.nodes = nodes
        self.accelerator = accelerator
        self.manager = manager
        self.forks = SandboxForks(manager)
        self.creations = SandboxCreations(manager, warm_pool)
        self.pauses = snapshots.pauses
        self.snapshots = snapshots
        self.collector = collector
        self.blockd = collector.blockd
        self.catalog = catalog
        self.puller = puller
        self.builds = builds
        self.volumes = volumes
        # Secrets, workload identity, and the egress proxy's `HeaderValues` (`resolve`).
        self.credentials = credentials
        self.memory = MemoryKeeper(manager, self.pauses.pause)
        builds.host = NodeBuildHost(self.create, snapshots)
        self.code_interpreter = CodeInterpreterTemplate(
            builds, cfg.node_name, snapshots.registry.lookup
        )
        self._stack = stack

    async def capacity(self) -> NodeCapacity:
        """What this node holds and may take now (what its heartbeat reports)."""
        return await node_capacity(self.manager, self.snapshots, self.blockd)

    @classmethod
    async def open(
        cls, cfg: Config, server_key: bytes | None = None, *, sealer: Sealer, hollow: bool = False
    ) -> Node:
        """The node's runtime. `server_key`, shared by a cluster's nodes, signs build-file
        upload URLs (`BuildFiles`) and seeds the egress CA; None: one of its own. `sealer`
        seals hosted credentials at rest (`credentials/sealing.py`). A `hollow` node runs
        all of this over machines that start nothing (`cluster/hollow.py`: tests and
        benchmarks only): no guest, namespace, block daemon, egress proxy or NFS server."""
        stack = contextlib.AsyncExitStack()
        try:
            return await cls._open(cfg, stack, server_key, sealer, hollow)
        except BaseException:
            await stack.aclose()
            raise

    @classmethod
    async def _open(
        cls,
        cfg: Config,
        stack: contextlib.AsyncExitStack,
        server_key: bytes | None,
        sealer: Sealer,
        hollow: bool,
    ) -> Node:
        kit = load_kit(cfg)
        if kit is None:
            raise PermanentlyUnavailable(
                "the guest kit is not built: run `aenv kit build` (or `make run`)"
            )
        if hollow:
            accel = AccelChoice(HollowDriver.name, "a hollow node starts no guest")
        else:
            # First: a node refused for its subnet has touched nothing.
            stack.enter_context(claimed_subnet(cfg.net.host_subnet))
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
        templates = TemplateRegistry(objects)
        blockd = HollowBlockd(cfg) if hollow else BlockdClient(cfg)
        await asyncio.to_thread(blockd.ensure_running)
        catalog = TemplateCatalog(cfg, templates, blockd)
        registry = RegistryClient(
            docker_config=Path(cfg.registry.auth_file) if cfg.registry.auth_file else None,
            insecure_registries=cfg.registry.insecure_hosts(),
            mirrors=cfg.registry.mirror_map(),
            platform=cfg.registry.platform,
        )
        stack.callback(registry.close)
        puller = ImagePuller(
            objects, registry, templates, cfg.home / "pull", cfg.sandbox.disk_size_mb * 2**20
        )
        store = await SqlSandboxStore.open(cfg.state_url, cfg.node_name, cfg.state.max_connections)
        stack.push_async_callback(store.close)
        credentials = Credentials.on(store.engine, store, sealer, IdentitySettings.of(cfg))
        await credentials.open()
        if hollow:
            host = MachineHost.hollow()
        else:
            host = MachineHost.linux(
                QemuDriver(
                    cfg.vmm.qemu_binary,
                    accel.name,
                    run_dir_for(cfg.home),
                    merge_pages=cfg.sandbox.merge_identical_pages,
                    translation_buffer_mb=cfg.vmm.tcg_translation_buffer_mb,
                    nice=cfg.vmm.guest_nice,
                )
            )
        boot_snapshots = None
        if cfg.sandbox.boot_snapshots and not hollow:
            boot_snapshots = BootSnapshots(
                cfg.kit_dir / "boot-snapshots",
                kit,
                host.driver,
                guest_kernel_args(cfg),
                accel.name,
                cfg.sandbox.boot_timeout,
            )
            stack.push_async_callback(boot_snapshots.close)
            boot_snapshots.request(Shape(cfg.sandbox.vcpus, cfg.sandbox.memory_mb))
        manager = SandboxManager(cfg, store, host, kit, catalog, boot_snapshots)
        volumes = Volumes(VolumeRegistry(store.engine), cfg.volumes_dir, cfg.node_name)
        if not hollow:
            await _open_egress_and_exports(cfg, stack, manager, volumes, credentials, server_key)
        await recover(manager)
        uploads = Uploads(manager, objects)
        stack.push_async_callback(uploads.close)
        snapshot_registry = SnapshotRegistry(objects)
        served_ram = ServedRam(blockd, objects, [cfg.sandboxes_dir, cfg.home / "snapshots"])
        pauses = SandboxPauses(manager, objects, served_ram)
        snapshots = SandboxSnapshots(pauses, snapshot_registry, catalog, uploads)
        await snapshots.open()
        scanner = asyncio.create_task(uploads.run())
        stack.push_async_callback(_cancelled, scanner)
        builds = TemplateBuilds(
            cfg, catalog, puller, manager.intake.capacity.max_vcpus, BuildFiles(objects, server_key)
        )
        stack.push_async_callback(builds.close)
        nodes = NodeRegistry(store.engine)
        collector = Collector(objects, templates, snapshot_registry, store, blockd, nodes)
        pool = None
        if cfg.sandbox.warm_pool > 0 and boot_snapshots is not None:
            pool = WarmPool(manager, cfg.sandbox.warm_pool)
            stack.push_async_callback(pool.close)
            stack.push_async_callback(_cancelled, asyncio.create_task(pool.run()))
        node = cls(
            cfg, accel, manager, snapshots, collector, catalog, puller, builds, stack, nodes,
            volumes, credentials, pool,
        )  # fmt: skip
        await node.volumes.sweep()
        if base_in_store(cfg):
            # Before the node takes work: its sandboxes start from the stored base.
            try:
                await asyncio.to_thread(catalog.shared_base)
            except NotFound as exc:
                log.warning("%s", exc)
        tasks = [
            run_sweeper(node.pauses),
            collector.run_every(cfg.storage),
            served_ram.run_every(_RAM_SWEEP_INTERVAL),
            node.memory.run_every(cfg.sandbox.memory_sample_interval),
            credentials.identity.run_every(),
        ]
        if cfg.server.code_interpreter:
            tasks.append(node.code_interpreter.ensure())
        else:
            node.code_interpreter.missing = (
                f"template '{CODE_INTERPRETER}' not found (server.code_interpreter is off)"
            )
        if cfg.server.role == "node":
            # A hollow node declared lost stops its heartbeats only: its process serves
            # other hollow nodes.
            stop = (lambda: None) if hollow else None
            presence = NodePresence(nodes, manager, snapshots, blockd, stop, hollow=hollow)
            await presence.register()
            tasks.append(presence.run(cfg.cluster.heartbeat_interval))
        for task in tasks:
            stack.push_async_callback(_cancelled, asyncio.create_task(task))
        return node

    async def create(self, request: CreateRequest) -> SandboxRecord:
        """A sandbox from what `request.template_id` names: a snapshot or template built
        from steps (`name`, `name:tag`; first, as E2B's templates hold both), else a
        template (`name`, `name:default`), else, with `registry.pull_on_create`, the image
        a full reference names, pulled once. Anything else is a 404, never a pull."""
        snapshot = await asyncio.to_thread(self.snapshots.registry.lookup, request.template_id)
        if snapshot is None and request.template_id.partition(":")[0] == CODE_INTERPRETER:
            # Built in, maybe still being built: wait for it a while, else a 503.
            await self.code_interpreter.await_ready()
            snapshot = await asyncio.to_thread(self.snapshots.registry.lookup, request.template_id)
        if snapshot is not None:
            return await self.snapshots.create(snapshot, request)
        request.template_id = await asyncio.to_thread(self._template_named, request.template_id)
        return await self.creations.create(request)

    def _template_named(self, name: str) -> str:
        image = full_reference(name) if self.cfg.registry.pull_on_create else None
        if image is None:
            return self.catalog.named(name)
        return self.puller.pull_once(image, log.info).template_id

    async def close(self) -> None:
        await self._stack.aclose()


async def _open_egress_and_exports(
    cfg: Config,
    stack: contextlib.AsyncExitStack,
    manager: SandboxManager,
    volumes: Volumes,
    credentials: Credentials,
    server_key: bytes | None,
) -> None:
    """The node's egress proxy and host chains, and its NFS server for volumes: what its
    sandboxes' namespaces lead to, in place before any namespace is made or recovered."""
    networks = manager.networks
    authority = EgressAuthority(server_key or secrets.token_bytes(32))
    networks.trusted_ca = authority.ca_pem
    egress_proxy = EgressProxy(
        manager.routes.egress_at,
        networks.egress,
        cfg.net.host_subnet,
        authority=authority,
        header_values=credentials,
        upstream_tls=upstream_context(cfg.net.egress_trusted_cas),
    )
    proxy_ports = await egress_proxy.start()
    stack.push_async_callback(egress_proxy.close)
    networks.tunnels = EgressTunnels(
        lambda sandbox_id: route.egress if (route := manager.routes.get(sandbox_id)) else None,
        egress_proxy,
    )
    stack.push_async_callback(networks.tunnels.close_all)
    # Before any namespace's rules are written: they send guests to these ports.
    networks.egress = dataclasses.replace(networks.egress, proxy=proxy_ports)
    await ensure_host_forwarding(cfg.net.host_subnet, cfg.net.name_prefix, proxy_ports)
    nfs = NfsServer(cfg)
    # A crashed node's server goes; the recovery below starts a new one if a
    # sandbox still mounts a volume.
    await nfs.stop()
    stack.push_async_callback(nfs.stop)
    networks.egress = dataclasses.replace(networks.egress, nfs_server=IPv4Address(nfs.address))
    networks.exports = VolumeExports(manager.store, volumes, nfs, networks.plan)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def refresh_node_metrics(node: Node) -> None:
    """The state gauges, read from their sources as a scrape asks for them."""
    manager = node.manager
    records = await manager.store.list()
    counts: dict[str, int] = {}
    for record in records:
        counts[record.state.value] = counts.get(record.state.value, 0) + 1
    set_counts(SANDBOXES, counts, tuple(state.value for state in State))
    committed = committed_by(records)
    CAPACITY_MB.labels("total").set(manager.intake.capacity.memory_mb)
    CAPACITY_MB.labels("committed").set(sum(d.memory_mb for d in committed))
    CAPACITY_MB.labels("held").set(node.memory.held_mb())
    DISK_MB.labels("total").set(manager.intake.capacity.disk_mb)
    DISK_MB.labels("committed").set(sum(d.disk_mb for d in committed))
    stats = await asyncio.to_thread(node.blockd.try_stats)
    cache = (stats or {}).get("cache") or {}
    for kind in ("hits", "misses", "fetched_bytes", "bytes_used", "entries", "evictions"):
        CACHE.labels(kind).set(cache.get(kind, 0))
