"""The agent's aiohttp application: auth middleware, ``/health``, ``/init``, ``/envs``,
``/metrics``, ``/reclaim``, and the routes of the Connect services and ``/files``.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from . import eventlog, files, filesystem, init_secret, machine, process, trust, volumes
from .connect import ConnectError, error_response, json_response, log_error
from .reclaim import PROBES, IdleReclaimer
from .state import STATE_KEY, AgentState, app_key, get_state

log = logging.getLogger("aenv_agent")

# Reachable without X-Access-Token: /files checks the token or a signature itself.
OPEN_ROUTES = {("GET", "/health"), ("GET", "/files"), ("POST", "/files")}
# The host's alone: they carry the init secret instead of the sandbox's token.
HOST_ROUTES = {("POST", "/init"), ("POST", "/sync"), ("POST", "/reclaim")}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """/init and /sync need the host's secret, every other route but /health the access token;
    Connect routes get a Connect error."""
    state = get_state(request)
    route = (request.method, request.path)
    if request.path not in PROBES:
        request.app[RECLAIMER_KEY].touch()
    if route in HOST_ROUTES:
        given = request.headers.get(init_secret.HEADER, "")
        if init_secret.secret_ok(state.init_secret, given):
            return await handler(request)
        log_error(request, ValueError("wrong init secret"))
        return json_response({"code": 401, "message": f"{request.path} is the host's"}, status=401)
    if route in OPEN_ROUTES or state.token_ok(request):
        return await handler(request)
    err = ConnectError("unauthenticated", "missing or invalid X-Access-Token")
    log_error(request, err)
    if request.path.count("/") == 2 and "." in request.path.split("/")[1]:
        return error_response(err)
    return json_response({"code": 401, "message": err.message}, status=401)


async def health(_request: web.Request) -> web.Response:
    return web.Response(status=204)


async def init(request: web.Request) -> web.Response:
    state = get_state(request)
    try:
        body = json.loads(await request.read() or b"{}")
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
    except ValueError as err:
        log_error(request, err)
        return json_response({"code": 400, "message": f"invalid JSON: {err}"}, status=400)
    if state.guest:
        # Before anything else: the rest of /init and every later call work on this disk.
        try:
            await asyncio.to_thread(machine.attach_rootfs, state.rootfs.root)
            if body.get("timestamp"):
                machine.set_clock(str(body["timestamp"]))
            if body.get("entropy"):
                machine.seed_random(base64.b64decode(str(body["entropy"])))
            mounts = [volumes.VolumeMount.parse(m) for m in body.get("volumeMounts") or []]
            await asyncio.to_thread(volumes.mount_volumes, state.rootfs, mounts)
        except (OSError, ValueError) as err:
            log_error(request, err)
            return json_response({"code": 500, "message": f"init: {err}"}, status=500)
    env_vars = body.get("envVars") or {}
    if isinstance(env_vars, dict):
        state.env_vars.update({str(k): str(v) for k, v in env_vars.items()})
    if body.get("trustedCa") and not state.rootfs.is_host_root:
        try:
            found = await asyncio.to_thread(trust.trust, state.rootfs, str(body["trustedCa"]))
        except OSError as err:
            log_error(request, err)
            return json_response({"code": 500, "message": f"init: {err}"}, status=500)
        for name, value in found.items():
            state.env_vars.setdefault(name, value)  # the sandbox's own settings win
    if body.get("accessToken"):
        state.access_token = str(body["accessToken"])
    if body.get("defaultUser"):
        state.default_user = str(body["defaultUser"])
    if body.get("defaultWorkdir"):
        state.default_workdir = str(body["defaultWorkdir"])
    if isinstance(body.get("reclaimAfterIdle"), int | float):
        request.app[RECLAIMER_KEY].idle_after = float(body["reclaimAfterIdle"])
    return web.Response(status=204)


async def reclaim(request: web.Request) -> web.Response:
    """The host is short of memory: give back what an idle guest would, now."""
    if not get_state(request).guest:
        body = {"code": 409, "message": "not a guest: nothing to reclaim"}
        return json_response(body, status=409)
    freed = await request.app[RECLAIMER_KEY].reclaim()
    return json_response({"freed": freed})


async def sync(_request: web.Request) -> web.Response:
    """Flush every file system to its disk: a filesystem-only snapshot is taken next."""
    await asyncio.to_thread(os.sync)
    return web.Response(status=204)


async def envs(request: web.Request) -> web.Response:
    return json_response(get_state(request).env_vars)


class CpuSampler:
    """CPU busy percentage between successive /metrics calls, from /proc/stat."""

    def __init__(self) -> None:
        self.last = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            with open("/proc/stat") as fh:
                fields = [int(x) for x in fh.readline().split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    async def percent(self) -> float:
        total, idle = self._read()
        if total - self.last[0] <= 0:
            await asyncio.sleep(0.1)
            total, idle = self._read()
        d_total, d_idle = total - self.last[0], idle - self.last[1]
        self.last = (total, idle)
        return round(100.0 * (d_total - d_idle) / d_total, 2) if d_total > 0 else 0.0


def _meminfo() -> tuple[int, int, int]:
    """Total, used and page-cache bytes of guest memory."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0, 0
    total = values.get("MemTotal", 0)
    used = total - values.get("MemAvailable", values.get("MemFree", 0))
    return total, used, values.get("Cached", 0)


CPU_KEY = app_key("aenv_cpu", CpuSampler)
RECLAIMER_KEY = app_key("aenv_reclaimer", IdleReclaimer)


async def metrics(request: web.Request) -> web.Response:
    state = get_state(request)
    sampler: CpuSampler = request.app[CPU_KEY]
    reclaimer = request.app[RECLAIMER_KEY]
    mem_total, mem_used, mem_cache = _meminfo()
    vfs = os.statvfs(state.rootfs.root)
    return json_response(
        {
            "ts": int(time.time()),
            "cpu_count": os.cpu_count() or 1,
            "cpu_used_pct": await sampler.percent(),
            "mem_total": mem_total,
            "mem_used": mem_used,
            "mem_cache": mem_cache,
            "disk_used": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
            "disk_total": vfs.f_blocks * vfs.f_frsize,
            "idle_seconds": round(reclaimer.idle_seconds(), 1),
            "reclaims": reclaimer.reclaims,
        }
    )


def create_app(
    rootfs: str, guest: bool = False, init_secret_file: str | None = None
) -> web.Application:
    """The application serving ``rootfs``; as `guest`, /init also attaches the user's disk
    and its secret comes from the VMM, else from `init_secret_file`."""
    if guest:
        secret = init_secret.guest_source()
    elif init_secret_file:
        secret = init_secret.file_source(init_secret_file)
    else:
        secret = init_secret.no_source
    # client_max_size only bounds request.read()/post(); /files streams and is unaffected.
    app = web.Application(middlewares=[auth_middleware], client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = AgentState.create(rootfs, secret, guest)
    app[CPU_KEY] = CpuSampler()
    app[RECLAIMER_KEY] = IdleReclaimer()
    if guest:
        app.cleanup_ctx.append(_reclaim_when_idle)
    app.router.add_get("/health", health)
    app.router.add_post("/init", init)
    app.router.add_post("/sync", sync)
    app.router.add_get("/envs", envs)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reclaim", reclaim)
    eventlog.setup(app, log)
    files.setup(app)
    process.setup(app)
    filesystem.setup(app)
    return app


async def _reclaim_when_idle(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[RECLAIMER_KEY].run())
    yield
    task.cancel()


async def serve(
    host: str, port: int, rootfs: str, guest: bool = False, init_secret_file: str | None = None
) -> None:
    """Run until cancelled."""
    app = create_app(rootfs, guest, init_secret_file)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    # What is alive now is in the boot snapshot every clone maps. Left to the collector,
    # each full collection would write to every page these objects sit on, turning the
    # shared pages into each clone's private copies.
    gc.collect()
    gc.freeze()
    log.info("aenv agent listening on %s:%d, rootfs %s", host, port, rootfs)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
