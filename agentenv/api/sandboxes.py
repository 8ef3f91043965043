"""Sandbox routes of the E2B-compatible control plane, with the aliases older SDKs call."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from ipaddress import IPv4Address
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, Response

from ..config import Config
from ..errors import InvalidInput, NotFound, Unavailable, error_answer
from ..guest.agent import ENVD_VERSION
from ..net.dns import is_dns_name
from ..net.rules import egress_of
from ..net.transforms import normalize_rules
from ..runtime.machine.mounts import resolve_mounts
from ..runtime.node.adoption import adopt
from ..runtime.node.assembly import Node
from ..runtime.node.memorykeeper import MIB
from ..runtime.sandboxes.creation import CreateRequest
from ..state.lifecycle import PUBLIC_STATE
from ..state.sandboxes import SandboxOptions, SandboxRecord
from ..wire import ENVD_PORT
from .deps import ConfigDep, ManagerDep, NodeDep, PausesDep, SnapshotsDep
from .errors import ERROR_RESPONSES
from .listing import CLIENT_ID, ListQuery, list_query, listed_fields, listed_page, running_listed
from .models import (
    MAX_METRICS_SANDBOXES,
    Balloon,
    BalloonBody,
    ConnectBody,
    ForkBody,
    Lifecycle,
    ListedSandbox,
    NetworkEgress,
    NetworkInfo,
    NetworkUpdate,
    NewSandbox,
    PauseBody,
    RefreshBody,
    ResumeBody,
    Sandbox,
    SandboxDetail,
    SandboxesWithMetrics,
    SandboxMetric,
    SandboxNetwork,
    SandboxRecordAnswer,
    TimeoutBody,
)

router = APIRouter(responses=ERROR_RESPONSES)


def public_domain(cfg: Config) -> str | None:
    return cfg.server.domain or None


def sandbox_answer(record: SandboxRecord, domain: str | None) -> Sandbox:
    return Sandbox(
        templateID=record.template_id,
        sandboxID=record.sandbox_id,
        clientID=CLIENT_ID,
        envdVersion=ENVD_VERSION,
        alias=record.alias,
        envdAccessToken=record.access_token,
        trafficAccessToken=record.traffic_token,
        domain=domain,
    )


def network_option(
    network: SandboxNetwork | NetworkEgress | None, internet: bool
) -> dict[str, Any]:
    """The `network` option as stored: what was given, checked, its rules' keys lower-cased."""
    given = network.model_dump(exclude_none=True) if network is not None else {}
    if "egressProxy" in given:
        _check_proxy_address(given["egressProxy"]["address"])
    given.pop("allow_internet_access", None)  # an update's; stored as allow_internet
    if ENVD_PORT in given.get("httpsPorts", ()):
        raise InvalidInput(f"network.httpsPorts: the agent's port {ENVD_PORT} cannot be listed")
    if any(not 0 < port < 65536 for port in given.get("httpsPorts", ())):
        raise InvalidInput("network.httpsPorts: ports are 1 to 65535")
    if "rules" in given:
        given["rules"] = normalize_rules(given["rules"])
    egress_of(given, internet)
    return given


def _check_proxy_address(address: str) -> None:
    host, _, port = address.rpartition(":")
    if not 0 < int(port) < 65536:
        raise InvalidInput(f"network.egressProxy.address: {address!r}: ports are 1 to 65535")
    if not is_dns_name(host.lower()):
        try:
            IPv4Address(host)
        except ValueError:
            raise InvalidInput(
                f"network.egressProxy.address: {address!r}: the host must be a name or an"
                " IPv4 address"
            ) from None


async def _create(node: Node, body: NewSandbox, secure: bool) -> Sandbox:
    cfg = node.cfg
    auto_resume = bool(body.autoResume and body.autoResume.enabled)
    if auto_resume and not body.autoPauseMemory:
        # A filesystem-only pause has no running state for traffic to wake (E2B's rule).
        raise InvalidInput("autoResume needs autoPauseMemory: a paused disk cannot be woken")
    mounts = [m.model_dump() for m in body.volumeMounts or []]
    request = CreateRequest(
        template_id=body.templateID,
        timeout=cfg.sandbox.default_timeout if body.timeout is None else body.timeout,
        options=SandboxOptions(
            metadata=body.metadata,
            env_vars=body.envVars,
            auto_pause=body.autoPause,
            auto_pause_memory=body.autoPauseMemory,
            allow_internet=body.allow_internet_access,
            secure=secure,
            pause_after_idle=body.pauseAfterIdle,
            auto_resume=auto_resume,
            network=network_option(body.network, body.allow_internet_access),
            volume_mounts=await resolve_mounts(node.volumes, mounts),
            # Only a non-empty `tokens` map turns workload identity on (E2B's rule).
            iam=body.iam.model_dump() if body.iam and body.iam.tokens else {},
        ),
        vcpus=body.cpuCount,
    )
    record = await node.create(request)
    return sandbox_answer(record, public_domain(cfg))


@router.post("/v2/sandboxes", status_code=201, response_model_exclude_none=False)
async def create_sandbox_v2(node: NodeDep, body: NewSandbox) -> Sandbox:
    """Always secured, as E2B's v2 create is: SDK 2.51+ no longer sends `secure` at all."""
    return await _create(node, body, secure=True)


@router.post("/sandboxes", status_code=201)
async def create_sandbox(node: NodeDep, body: NewSandbox) -> Sandbox:
    """SDKs up to 2.50 send `secure` (true unless asked otherwise)."""
    return await _create(node, body, secure=body.secure)


def sandbox_detail(record: SandboxRecord, domain: str | None) -> SandboxDetail:
    paused = PUBLIC_STATE[record.state] == "paused"
    return SandboxDetail(
        **listed_fields(record),
        envdAccessToken=record.access_token,
        allowInternetAccess=record.allow_internet,
        network=NetworkInfo(**record.network) if record.network else None,
        domain=domain,
        lifecycle=Lifecycle(
            autoResume=record.auto_resume, onTimeout="pause" if record.auto_pause else "kill"
        ),
        # A record's mode is manager.FULL or FILESYSTEM, the two the model allows.
        pauseMode=cast('Literal["full", "filesystem"] | None', record.pause_mode)
        if paused
        else None,
        storage=("stored" if record.stored else "uploading") if paused else None,
    )


@router.get("/v2/sandboxes")
async def list_sandboxes_v2(
    node: NodeDep, response: Response, query: Annotated[ListQuery, Depends(list_query)]
) -> list[ListedSandbox]:
    page = listed_page(await node.manager.list(), response, query)
    return with_host_memory(node, page)


@router.get("/sandboxes")
async def list_sandboxes_v1(node: NodeDep, metadata: str | None = None) -> list[ListedSandbox]:
    """SDK 1.x: running sandboxes only, unpaginated."""
    return with_host_memory(node, running_listed(await node.manager.list(), metadata))


def with_host_memory(node: Node, listed: list[ListedSandbox]) -> list[ListedSandbox]:
    """Running sandboxes' host memory by the node's last sample (the control plane, which
    lists from the state store, has none)."""
    latest = node.memory.latest
    for item in listed:
        if item.sandboxID in latest:
            item.hostMemoryMB = latest[item.sandboxID].host.pss // MIB
    return listed


@router.get("/sandboxes/metrics", response_model_exclude_none=True)
async def many_sandboxes_metrics(node: NodeDep, sandbox_ids: str) -> SandboxesWithMetrics:
    """A sample taken now of each listed sandbox running here (E2B's `sandbox_ids`, comma
    separated, at most 100); others are left out."""
    ids = list(dict.fromkeys(filter(None, (i.strip() for i in sandbox_ids.split(",")))))
    if not 0 < len(ids) <= MAX_METRICS_SANDBOXES:
        raise InvalidInput(f"sandbox_ids: 1 to {MAX_METRICS_SANDBOXES} sandbox ids")
    found = {}
    for sandbox_id in ids:
        try:
            sample = await node.manager.metrics(sandbox_id)
            if sample is None:
                continue
            host = await node.memory.host_footprint(sandbox_id)
        except (NotFound, Unavailable):
            # Gone (killed between the two reads, too), or its guest did not answer: left
            # out, as not running.
            continue
        found[sandbox_id] = _metric(sample, host.pss if host is not None else None)
    return SandboxesWithMetrics(sandboxes=found)


@router.get("/sandboxes/{sandbox_id}", response_model_exclude_none=True)
async def get_sandbox(manager: ManagerDep, cfg: ConfigDep, sandbox_id: str) -> SandboxDetail:
    return sandbox_detail(await manager.get(sandbox_id), public_domain(cfg))


@router.get("/unstable/sandboxes/{sandbox_id}/record")
async def sandbox_record(
    manager: ManagerDep, cfg: ConfigDep, sandbox_id: str
) -> SandboxRecordAnswer:
    """E2B's record of a sandbox. Only a sandbox that exists has one here: a killed
    sandbox's record goes with it (404)."""
    record = await manager.get(sandbox_id)
    return SandboxRecordAnswer(**listed_fields(record), domain=public_domain(cfg))


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill_sandbox(manager: ManagerDep, sandbox_id: str) -> Response:
    await manager.kill(sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/adopt", status_code=204)
async def adopt_sandbox(node: NodeDep, sandbox_id: str) -> None:
    """Not E2B's: the control plane moves a lost node's paused sandbox to this node."""
    await adopt(node.manager, node.nodes, sandbox_id)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(manager: ManagerDep, sandbox_id: str, body: TimeoutBody) -> Response:
    await manager.set_timeout(sandbox_id, body.timeout)
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(manager: ManagerDep, sandbox_id: str, body: NetworkUpdate) -> Response:
    """E2B's update: the egress rules are replaced, and what the body omits is cleared."""
    internet = body.allow_internet_access
    await manager.update_network(sandbox_id, network_option(body, internet), internet)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
async def refresh(
    manager: ManagerDep, sandbox_id: str, body: RefreshBody | None = None
) -> Response:
    await manager.refresh(sandbox_id, (body or RefreshBody()).duration)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause_sandbox(
    pauses: PausesDep, snapshots: SnapshotsDep, sandbox_id: str, body: PauseBody | None = None
) -> Response:
    """`memory: false` keeps the disk alone; a resume then starts a fresh guest on it.
    `waitStored: true` answers once the paused state is in the object store."""
    body = body or PauseBody()
    await pauses.pause(sandbox_id, body.memory, body.requireHealthyGuest)
    if body.waitStored:
        await snapshots.uploads.until_stored(sandbox_id)
    return Response(status_code=204)


def _resume_timeout(cfg: Config, body: ConnectBody) -> int:
    return cfg.sandbox.default_timeout if body.timeout is None else body.timeout


async def _connect(
    node: Node, response: Response, sandbox_id: str, body: ConnectBody | None
) -> Sandbox:
    body = body or ConnectBody()
    timeout = _resume_timeout(node.cfg, body)
    record, resumed = await node.pauses.connect(sandbox_id, timeout, body.memory)
    response.status_code = 201 if resumed else 200
    return sandbox_answer(record, public_domain(node.cfg))


@router.post("/v2/sandboxes/{sandbox_id}/connect", status_code=200)
async def connect_sandbox_v2(
    node: NodeDep, response: Response, sandbox_id: str, body: ConnectBody | None = None
) -> Sandbox:
    """Resume if paused (201) or return the running sandbox (200)."""
    return await _connect(node, response, sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/connect", status_code=200)
async def connect_sandbox(
    node: NodeDep, response: Response, sandbox_id: str, body: ConnectBody | None = None
) -> Sandbox:
    return await _connect(node, response, sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def resume_sandbox(node: NodeDep, sandbox_id: str, body: ResumeBody | None = None) -> Sandbox:
    """SDK 2.0-2.5: resume a paused sandbox; a running one is a 409."""
    body = body or ResumeBody()
    if body.cpuCount is not None:
        vcpus = (await node.manager.get(sandbox_id)).vcpus
        if body.cpuCount != vcpus:
            raise InvalidInput(f"cpuCount: a paused sandbox resumes with its {vcpus} CPUs")
    record = await node.pauses.resume(sandbox_id, _resume_timeout(node.cfg, body), body.memory)
    if body.autoPause is not None:
        await node.manager.set_auto_pause(sandbox_id, body.autoPause)
    return sandbox_answer(record, public_domain(node.cfg))


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork_sandbox(
    node: NodeDep, sandbox_id: str, body: ForkBody | None = None
) -> list[dict[str, Any]]:
    """Checkpoint the sandbox in place and start `count` forks; one result per fork."""
    body = body or ForkBody()
    if body.count > node.cfg.sandbox.max_forks:
        raise InvalidInput(
            f"count must be at most {node.cfg.sandbox.max_forks} (sandbox.max_forks)"
        )
    results = await node.forks.fork(sandbox_id, body.count, body.timeout)
    domain = public_domain(node.cfg)
    out: list[dict[str, Any]] = []
    for result in results:
        if isinstance(result, SandboxRecord):
            out.append({"sandbox": sandbox_answer(result, domain).model_dump(mode="json")})
        else:
            out.append({"error": error_answer(result).body()})
    return out


@router.get("/sandboxes/{sandbox_id}/metrics")
async def sandbox_metrics(
    node: NodeDep, sandbox_id: str, start: int | None = None, end: int | None = None
) -> list[SandboxMetric]:
    """The guest's samples with `start <= timestamp <= end` (seconds), oldest first: those
    the node took (`runtime/memory/metricshistory.py`), and one taken now when the range reaches
    the present and the sandbox runs. `hostMemUsed` is the present's."""
    manager = node.manager
    if end is None or end >= time.time() - 1:
        await manager.metrics(sandbox_id)  # recorded; None (and nothing) when not running
    else:
        await manager.get(sandbox_id)  # 404 for an unknown sandbox, as with a fresh sample
    samples = manager.metrics_history.between(sandbox_id, start, end)
    host = await node.memory.host_footprint(sandbox_id) if samples else None
    return [_metric(s, host.pss if host is not None else None) for s in samples]


def _metric(sample: dict[str, Any], host_bytes: int | None) -> SandboxMetric:
    return SandboxMetric(
        timestamp=datetime.fromtimestamp(int(sample["ts"]), UTC),
        timestampUnix=int(sample["ts"]),
        cpuCount=sample["cpu_count"],
        cpuUsedPct=sample["cpu_used_pct"],
        memUsed=sample["mem_used"],
        memTotal=sample["mem_total"],
        memCache=sample.get("mem_cache", 0),
        diskUsed=sample["disk_used"],
        diskTotal=sample["disk_total"],
        hostMemUsed=host_bytes,
    )


@router.get("/sandboxes/{sandbox_id}/balloon")
async def get_balloon(node: NodeDep, sandbox_id: str) -> Balloon:
    """Not E2B's: a running sandbox's balloon and its guest's memory report."""
    stats = await node.memory.balloon(sandbox_id)
    return Balloon(
        actualMB=stats.actual_mb,
        totalMB=stats.total_mb,
        freeMB=stats.free_mb,
        availableMB=stats.available_mb,
        diskCachesMB=stats.disk_caches_mb,
    )


@router.put("/sandboxes/{sandbox_id}/balloon", status_code=204)
async def set_balloon(node: NodeDep, sandbox_id: str, body: BalloonBody) -> Response:
    """Not E2B's: leave the guest `targetMB` of its memory; the rest returns to the host."""
    await node.memory.set_balloon(sandbox_id, body.targetMB)
    return Response(status_code=204)
